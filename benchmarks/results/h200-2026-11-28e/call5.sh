source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
ulimit -n 65536
python3 -m wsserver --model $C --device 0 --port 8777 --max-num-seqs 512 --max-connections 512 --max-patches 60 --fp8-gemms on --step-trace-dir trace > $OUT/server.txt 2>&1 &
SP=$!
for i in $(seq 120); do python3 -c "import json,urllib.request as u; s=json.load(u.urlopen('http://127.0.0.1:8777/status')); assert s['ready'] and all(e['healthy'] for e in s['engines'])" 2>/dev/null && break; sleep 1; done; t ready $?
WS="python3 benchmarks/ws_latency.py --url http://127.0.0.1:8777 --sessions 512 --format opus --sample-rate 48000 --client-processes 4"
for r in 1 2 3; do timeout 120 $WS 2>>$OUT/ws_err.txt | grep '^{' | sed 's/^{/{"run":'$r',/' >> $OUT/ws.jsonl; t ws$r $?; done
timeout 120 python3 benchmarks/ws_latency.py --url http://127.0.0.1:8777 --sessions 512 --format pcm_s16le --sample-rate 24000 --client-processes 4 2>>$OUT/ws_err.txt | grep '^{' | sed 's/^{/{"run":"pcm",/' >> $OUT/ws.jsonl; t pcm $?
kill -TERM $SP; wait $SP
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/ws.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("run", "format", "starved_sessions", "starved_ms_total", "dry_at_audio_s", "xrt", "opus_frames")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "client": d["cpu"]["client"]["util"]}))
PY
python3 .carry/bursts.py trace/engine-0.jsonl srv
gzip -c trace/engine-0.jsonl > $OUT/trace.jsonl.gz
grep -v "uvicorn.error\|SyntaxWarning\|is not 0\|connection closed\|connection open\|draining" $OUT/server.txt | tail -c 600; tail -c 400 $OUT/ws_err.txt
