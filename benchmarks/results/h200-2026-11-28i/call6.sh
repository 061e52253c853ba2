source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt &
timeout 60 python3 -m pytest -q -m gpu tests/engine/kernels/test_kernels_gpu.py -k "gate_up" -p no:cacheprovider 2>&1 | tail -2 | tee $OUT/gpu_tests.txt; t gpu_tests $?
wait; t ckpt $?
timeout 150 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 1024 --max-num-seqs 1024 --fp8-gemms on 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/bench.jsonl; t bench $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("concurrency", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate", "gap_max_ms")}))
PY
