source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
timeout 280 python3 -m pytest -q -m gpu tests/engine -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1; t gputests $?
tail -5 $OUT/gpu_tests.txt
git apply .carry/hop.patch; t patch $?
mkdir -p hop_w hop_0
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 1 1 1 --format opus --sample-rate 48000 --client-processes 1 --server-args=--fp8-gemms=on"
HOP_TRACE_DIR=$PWD/hop_w timeout 150 $WS 2>$OUT/err_w.txt | grep '^{' > $OUT/ws_w.jsonl; t ws_workers $?
HOP_TRACE_DIR=$PWD/hop_0 timeout 150 $WS --workers 0 2>$OUT/err_0.txt | grep '^{' > $OUT/ws_0.jsonl; t ws_single $?
tar czf $OUT/hops.tgz hop_w hop_0
python3 - <<'PY'
import json, os
for f in ("ws_w", "ws_0"):
    for l in open(os.environ["OUT"] + f"/{f}.jsonl"):
        d = json.loads(l)
        if "sessions" in d:
            print(f, d["workers"], d["format"], d["first_text_to_first_frame_ms"]["p50"], d["server_ttfa_ms_p50"], d["server_queue_ms_p50"])
PY
