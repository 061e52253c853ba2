source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
rm -rf trace .carry/base/trace
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 512 --format opus pcm_s16le --sample-rate 48000 24000 --client-processes 4"
timeout 300 python3 benchmarks/ab_trees.py run --base .carry/base -- $WS "--server-args=--fp8-gemms on --step-trace-dir trace" 2>$OUT/err.txt | grep '^{' > $OUT/ws_ab.jsonl; t ab $?
python3 .carry/bursts.py .carry/base/trace/engine-0.jsonl base > $OUT/bursts.jsonl; python3 .carry/bursts.py trace/engine-0.jsonl new >> $OUT/bursts.jsonl
gzip -c .carry/base/trace/engine-0.jsonl > $OUT/trace_base.jsonl.gz; gzip -c trace/engine-0.jsonl > $OUT/trace_new.jsonl.gz
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/ws_ab.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("tree", "format", "sessions", "starved_sessions", "starved_ms_total", "dry_at_audio_s", "xrt")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "ff95": d["first_text_to_first_frame_ms"].get("p95"), "wcpu": (d["cpu"].get("workers") or {}).get("util")}))
PY
cut -c1-400 $OUT/bursts.jsonl
grep -h "warmed up" $OUT/err.txt
grep -v "uvicorn.error\|SyntaxWarning\|is not 0\|connection closed\|connection open\|draining" $OUT/err.txt | tail -c 500
