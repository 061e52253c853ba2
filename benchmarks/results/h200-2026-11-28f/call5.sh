source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt; nproc
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
timeout 90 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 512 --max-num-seqs 512 --fp8-gemms on 2>>$OUT/err_b.txt | grep '^{' > $OUT/bench_engine.jsonl; t bench $?
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --client-processes 4 --client-cpus 12-15"
timeout 240 $WS --sessions 512 512 1 --format opus pcm_s16le --sample-rate 48000 24000 "--server-args=--fp8-gemms on" 2>$OUT/err_ws.txt | grep '^{' > $OUT/ws.jsonl; t ws $?
timeout 100 $WS --workers 0 --sessions 1 1 1 --format opus --sample-rate 48000 "--server-args=--fp8-gemms on" 2>$OUT/err_ws0.txt | grep '^{' >> $OUT/ws.jsonl; t ws_single $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/ws.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("workers", "format", "sessions", "starved_sessions", "starved_ms_total", "dry_at_audio_s", "xrt", "client_lag_ms", "client_cpus", "server_cpus")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "ff95": d["first_text_to_first_frame_ms"].get("p95"), "wcpu": (d["cpu"].get("workers") or {}).get("util"), "ccpu": d["cpu"]["client"]["util_max"]}))
PY
cut -c1-330 $OUT/bench_engine.jsonl
