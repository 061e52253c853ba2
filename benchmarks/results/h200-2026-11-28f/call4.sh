source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
git apply .carry/hop2.patch; t patch $?
mkdir -p hops trace
HOP_TRACE_DIR=$PWD/hops timeout 200 python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --client-processes 4 --sessions 512 512 --format opus --sample-rate 48000 "--server-args=--fp8-gemms on --step-trace-dir trace" 2>$OUT/err.txt | grep '^{' > $OUT/ws.jsonl; t ws $?
tar czf $OUT/hops.tgz hops trace
ls hops | wc -l; du -sh hops
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/ws.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("workers", "format", "sessions", "starved_sessions", "starved_ms_total", "dry_at_audio_s", "xrt", "client_lag_ms", "started_monotonic_s", "wall_s")} | {"ff": d["first_text_to_first_frame_ms"]["p50"]}))
PY
