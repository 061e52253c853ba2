source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt &
timeout 170 python3 -m pytest -q -m gpu tests/engine/kernels/test_kernels_gpu.py -k "gate_up or block_mlp or fp8" tests/engine/models/voxcpm/test_fp8.py -s -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
grep -E "gate_up_silu_fp8 |patch drift|passed|failed|FAILED|Error" $OUT/gpu_tests.txt | tail -25
wait; t ckpt $?
B="benchmarks/bench_engine.py --model $C --steps 60 --max-num-seqs 512 --fp8-gemms on"
(cd .carry/mid && PYTHONPATH=$ROOT/.carry/mid:$PYTHONPATH timeout 90 python3 $B --concurrency 25 512 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "mid", /' >> $OUT/bench_ab.jsonl); t bench_mid $?
timeout 90 python3 $B --concurrency 25 512 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t bench_new $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench_ab.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
PY
grep -c Traceback $OUT/err.txt
