# Not run yet (~330 s): does c00df75 (fewer warps for RoPE, quantize_rows and the tiny-row attention on large grids)
# move the engine beyond the runs' spread? bench_engine.py c=512 alternating 86f50fb (base) and HEAD, three rounds,
# then c=1 on both (small grids keep their widths: it should not move).
#   scripts/prepare_device_carry.sh; python benchmarks/ab_trees.py prepare --ref 86f50fb --out .carry/base;
#   cp benchmarks/results/h200-2026-11-29/next_warps_ab.sh .carry/; then bash .carry/next_warps_ab.sh with carry [".carry"].
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
for c in 512 512 512 1; do
  B="benchmarks/bench_engine.py --model $C --steps 60 --concurrency $c --max-num-seqs 512 --fp8-gemms on"
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 60 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /' >> $OUT/bench_ab.jsonl); t base_$c $?
  timeout 60 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t new_$c $?
done
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench_ab.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
PY
