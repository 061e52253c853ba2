source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
WS1="benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 1 1 1 1 1 1 1 --format opus --sample-rate 48000 --client-processes 1 --client-cpus 12-15 --server-args=--fp8-gemms=on"
for round in 1 2; do
  timeout 70 python3 $WS1 --workers 0 2>>$OUT/err.txt | grep '^{' >> $OUT/ws1_one.jsonl; t one_$round $?
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 70 python3 $WS1 2>>$OUT/err.txt | grep '^{' >> $OUT/ws1_base.jsonl); t base_$round $?
  timeout 70 python3 $WS1 2>>$OUT/err.txt | grep '^{' >> $OUT/ws1_new.jsonl; t new_$round $?
done
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for layout in ("one", "base", "new"):
    ff = [json.loads(l)["first_text_to_first_frame_ms"]["p50"] for l in open(f"{out}/ws1_{layout}.jsonl") if '"sessions"' in l]
    print(json.dumps({"layout": layout, "levels": len(ff), "first_frame_ms": ff, "median": statistics.median(ff) if ff else None, "median_without_warmups": statistics.median(ff[1:8] + ff[9:]) if len(ff) == 16 else None}))
PY
timeout 80 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 --max-num-seqs 512 --fp8-gemms on 2>>$OUT/err.txt | grep '^{' > $OUT/bench_engine.jsonl; t bench $?
timeout 120 python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --client-processes 4 --client-cpus 12-15 --sessions 512 --format opus --sample-rate 48000 "--server-args=--fp8-gemms on" 2>>$OUT/err.txt | grep '^{' > $OUT/ws512.jsonl; t ws512 $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/ws512.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("format", "sessions", "starved_sessions", "starved_ms_total", "xrt")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "ff95": d["first_text_to_first_frame_ms"].get("p95"), "lag99": d["client_lag_ms"]["p99"], "wcpu": (d["cpu"].get("workers") or {}).get("util")}))
PY
cut -c1-300 $OUT/bench_engine.jsonl
grep -c "Traceback" $OUT/err.txt
