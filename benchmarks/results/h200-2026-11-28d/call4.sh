source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
git log -1 --format=%H 2>/dev/null | tee $OUT/commit.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
timeout 90 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 512 --max-num-seqs 512 --fp8-gemms on 2>>$OUT/err.txt | grep '^{' > $OUT/bench_engine.jsonl; t bench $?
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --format opus pcm_s16le --sample-rate 48000 24000 --client-processes 4"
rm -rf trace
timeout 200 $WS --sessions 1 512 "--server-args=--fp8-gemms on --step-trace-dir trace" 2>>$OUT/err.txt | grep '^{' | sed 's/^{/{"r":1,/' >> $OUT/ws.jsonl; t ws1 $?
timeout 150 $WS --sessions 1 512 "--server-args=--fp8-gemms on" 2>>$OUT/err.txt | grep '^{' | sed 's/^{/{"r":2,/' >> $OUT/ws.jsonl; t ws2 $?
timeout 100 $WS --sessions 1 --workers 0 "--server-args=--fp8-gemms on" 2>>$OUT/err.txt | grep '^{' | sed 's/^{/{"r":"one-process",/' >> $OUT/ws.jsonl; t ws0 $?
grep '"r":1,' $OUT/ws.jsonl | sed 's/^{"r":1,/{/' > /tmp/lv.jsonl; python3 benchmarks/step_trace.py --trace trace/engine-0.jsonl --levels /tmp/lv.jsonl --admissions 3 > $OUT/trace_summary.jsonl; gzip -c trace/engine-0.jsonl > $OUT/trace.jsonl.gz
cut -c1-300 $OUT/bench_engine.jsonl | tail -2
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/ws.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("r", "format", "sessions", "workers", "starved_sessions", "starved_ms_total", "dry_at_audio_s", "xrt")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "ff95": d["first_text_to_first_frame_ms"].get("p95"), "wcpu": (d["cpu"].get("workers") or {}).get("util")}))
PY
cut -c1-400 $OUT/trace_summary.jsonl
grep -v "uvicorn.error\|SyntaxWarning\|is not 0\|connection closed\|draining" $OUT/err.txt | tail -c 1000
