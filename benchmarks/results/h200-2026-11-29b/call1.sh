# Session 14, call 1: RMSNorm launch widths (kernel_warps_bench.py norm); persistent gate/up kernels against the
# engine's (gate_up_persistent_bench.py); then c00df75 against 86f50fb in the engine, c=512 alternating, two rounds.
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; echo done > /tmp/ckpt_done) &
timeout 60 python3 benchmarks/results/h200-2026-11-29/kernel_warps_bench.py norm 2>>$OUT/err.txt | tee $OUT/norm_warps.jsonl; t norm $?
timeout 200 python3 benchmarks/results/h200-2026-11-29b/gate_up_persistent_bench.py 2>>$OUT/err.txt | tee $OUT/gate_up.jsonl; t gate_up $?
wait; t ckpt 0
for r in 1 2; do
  B="benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 --max-num-seqs 512 --fp8-gemms on"
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 60 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /' >> $OUT/bench_ab.jsonl); t base_$r $?
  timeout 60 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t new_$r $?
done
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench_ab.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
PY
tail -5 $OUT/err.txt
