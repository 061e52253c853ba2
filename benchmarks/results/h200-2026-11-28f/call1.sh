source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
git apply .carry/hop.patch; t patch $?
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
mkdir -p $OUT/hop_w $OUT/hop_0
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 1 1 1 1 1 --format opus pcm_s16le --sample-rate 48000 24000 --client-processes 1 --server-args=--fp8-gemms=on"
HOP_TRACE_DIR=$OUT/hop_w timeout 200 $WS 2>$OUT/err_w.txt | grep '^{' > $OUT/ws_w.jsonl; t ws_workers $?
HOP_TRACE_DIR=$OUT/hop_0 timeout 200 $WS --workers 0 2>$OUT/err_0.txt | grep '^{' > $OUT/ws_0.jsonl; t ws_single $?
timeout 75 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 1 1 --fp8-gemms on 2>>$OUT/err_b.txt | grep '^{' > $OUT/bench_engine.jsonl; t bench $?
python3 - <<'PY'
import json, os
for f in ("ws_w", "ws_0"):
    for l in open(os.environ["OUT"] + f"/{f}.jsonl"):
        d = json.loads(l)
        if "sessions" in d:
            print(f, d["workers"], d["format"], d["first_text_to_first_frame_ms"]["p50"], d["server_ttfa_ms_p50"], d["server_queue_ms_p50"])
PY
cut -c1-300 $OUT/bench_engine.jsonl
tail -c 600 $OUT/err_w.txt
