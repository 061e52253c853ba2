source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 150 python3 -m pytest -q -m gpu tests/engine/kernels/test_kernels_gpu.py -k "gate_up or block_matmul or fp8" tests/engine/models/voxcpm/test_fp8.py -s -p no:cacheprovider 2>&1 | grep -E "passed|failed|FAILED|drift|Error" | tail -15 | tee $OUT/gpu_tests.txt; t gpu_tests $?
B="benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 --max-num-seqs 512 --fp8-gemms on"
for r in 1 2; do
  (cd .carry/mid && PYTHONPATH=$ROOT/.carry/mid:$PYTHONPATH timeout 80 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "mid", /' >> $OUT/bench_ab.jsonl); t bench_mid_$r $?
  timeout 80 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t bench_new_$r $?
done
WS="benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --client-processes 4 --client-cpus 12-15 --sessions 512 --format opus --sample-rate 48000 --server-args=--fp8-gemms=on"
(cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 100 python3 $WS 2>>$OUT/err.txt | grep '^{' | sed 's/^{/{"tree": "base", /' >> $OUT/ws512.jsonl); t ws_base $?
(cd .carry/mid && PYTHONPATH=$ROOT/.carry/mid:$PYTHONPATH timeout 100 python3 $WS 2>>$OUT/err.txt | grep '^{' | sed 's/^{/{"tree": "mid", /' >> $OUT/ws512.jsonl); t ws_mid $?
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for l in open(f"{out}/bench_ab.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
for l in open(f"{out}/ws512.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("tree", "format", "sessions", "starved_sessions", "xrt")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "lag99": d["client_lag_ms"]["p99"], "wcpu": (d["cpu"].get("workers") or {}).get("util"), "ecpu": (d["cpu"].get("engines") or d["cpu"].get("engine") or {})}))
PY
grep -c Traceback $OUT/err.txt
