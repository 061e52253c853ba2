# Call 5: call 4 with the attention kernel cut to one head per 1x128 block (D = 128: its scale a row reduction, no reshape).
# micro-benchmark, then bench_engine c=512 alternating base (86f50fb, .carry/base) and this tree, then c=1 here.
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 200 python3 -m pytest -q -m gpu tests/engine/kernels/test_kernels_gpu.py -k "rope_attention or fp8_block_attention or drift" tests/engine/models/voxcpm/test_fp8.py -p no:cacheprovider 2>&1 | tail -15 > $OUT/gpu_tests.txt; t gpu_tests $?
tail -3 $OUT/gpu_tests.txt
timeout 100 python3 benchmarks/results/h200-2026-11-29/attention_fp8_bench.py 2>>$OUT/err.txt | tee $OUT/attention_bench.jsonl; t attention_bench $?
B="benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 --max-num-seqs 512 --fp8-gemms on"
for r in 1 2; do
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 80 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /' >> $OUT/bench_ab.jsonl); t bench_base_$r $?
  timeout 80 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t bench_new_$r $?
done
timeout 60 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 --fp8-gemms on 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t bench_c1 $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench_ab.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
PY
grep -c Traceback $OUT/err.txt
