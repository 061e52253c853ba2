source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
B="python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 512 512 --max-num-seqs 512 --fp8-gemms on --pace-admissions on"
for v in base eager replay; do
  rm -f /tmp/tr_$v.jsonl
  case $v in
    base) timeout 150 $B --step-trace /tmp/tr_$v.jsonl ;;
    eager) CUDA_MODULE_LOADING=EAGER timeout 150 $B --step-trace /tmp/tr_$v.jsonl ;;
    replay) VOX_EXP_REPLAY=1 timeout 150 $B --step-trace /tmp/tr_$v.jsonl ;;
  esac 2>>$OUT/err.txt | grep '^{' | sed "s/^{/{\"v\":\"$v\",/" >> $OUT/bench.jsonl; t bench_$v $?
  python3 .carry/bursts.py /tmp/tr_$v.jsonl $v >> $OUT/bursts.jsonl; gzip -c /tmp/tr_$v.jsonl > $OUT/tr_$v.jsonl.gz
done
rm -rf trace
timeout 200 python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 512 512 --format pcm_s16le --sample-rate 24000 --client-processes 4 "--server-args=--fp8-gemms on --step-trace-dir trace" 2>>$OUT/err.txt | grep '^{' > $OUT/ws.jsonl; t ws $?
python3 .carry/bursts.py trace/engine-0.jsonl ws_pcm >> $OUT/bursts.jsonl; gzip -c trace/engine-0.jsonl > $OUT/tr_ws.jsonl.gz
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/ws.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("format", "sessions", "starved_sessions", "starved_ms_total", "dry_at_audio_s", "xrt")} | {"ff": d["first_text_to_first_frame_ms"]["p50"]}))
PY
python3 -c "
import json
for l in open('$OUT/bench.jsonl'):
    d=json.loads(l)
    if 'concurrency' in d: print(d['v'], d['concurrency'], d['ttfb_p50_ms'], d['ttfb_p90_ms'], d['rtf_p90'], d['xrt_aggregate'], d['gap_max_ms'])
"
cat $OUT/bursts.jsonl
tail -c 1500 $OUT/err.txt
