# Session 16, call 4: the 512-session levels on HEAD (deferred hand-over, idle budget): the engine alone at c=512, then 512 Opus
# sessions at 48 kHz and 512 PCM at 24 kHz through the server (14 workers), clients on CPUs 12-15.
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 60 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 --max-num-seqs 512 --fp8-gemms on 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/bench.jsonl; t bench $?
timeout 150 python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --client-processes 4 --client-cpus 12-15 --sessions 512 --format opus pcm_s16le --sample-rate 48000 24000 "--server-args=--fp8-gemms on" 2>>$OUT/err.txt | grep '^{' > $OUT/ws.jsonl; t ws $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
for l in open(os.environ["OUT"] + "/ws.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("format", "sessions", "starved_sessions", "starved_ms_total", "xrt")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "ff95": d["first_text_to_first_frame_ms"].get("p95"), "lag99": d["client_lag_ms"]["p99"], "wcpu": (d["cpu"].get("workers") or {}).get("util")}))
PY
tail -2 $OUT/err.txt
B="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
timeout 90 python3 benchmarks/bench_engine.py $B --fp8-backbone on 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/bench1024_fp8_backbone.jsonl; t backbone $?
SHORT="hello world and the speech model is to stream audio and voice test the model is to stream the voice and the audio test world hello"
timeout 90 python3 benchmarks/bench_engine.py $B --text "$SHORT" 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/bench1024_short26.jsonl; t short $?
for f in bench1024_fp8_backbone bench1024_short26; do python3 -c "
import json
for l in open('$OUT/$f.jsonl'):
    d = json.loads(l); print('$f', json.dumps({k: d.get(k) for k in ('concurrency', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_p90', 'xrt_aggregate')}))"; done
