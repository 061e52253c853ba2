source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
rm -f tr.jsonl .carry/base/tr.jsonl
timeout 260 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 512 512 --max-num-seqs 512 --fp8-gemms on --pace-admissions on --step-trace tr.jsonl 2>$OUT/bench_err.txt | grep '^{' > $OUT/bench_ab.jsonl; t bench $?
python3 .carry/bursts.py .carry/base/tr.jsonl bench_base >> $OUT/bursts.jsonl; python3 .carry/bursts.py tr.jsonl bench_new >> $OUT/bursts.jsonl
rm -rf trace .carry/base/trace
timeout 300 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 512 512 --format opus --sample-rate 48000 --client-processes 4 "--server-args=--fp8-gemms on --step-trace-dir trace" 2>$OUT/ws_err.txt | grep '^{' > $OUT/ws_ab.jsonl; t ws $?
python3 .carry/bursts.py .carry/base/trace/engine-0.jsonl ws_base >> $OUT/bursts.jsonl; python3 .carry/bursts.py trace/engine-0.jsonl ws_new >> $OUT/bursts.jsonl
cat .carry/base/trace/engine-0.jsonl | gzip > $OUT/ws_trace_base.jsonl.gz; gzip -c trace/engine-0.jsonl > $OUT/ws_trace_new.jsonl.gz
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench_ab.jsonl"):
    d = json.loads(l)
    if "concurrency" in d: print(d["tree"], d["concurrency"], d["ttfb_p50_ms"], d["ttfb_p90_ms"], d["rtf_p90"], d["xrt_aggregate"], d["gap_max_ms"])
for l in open(os.environ["OUT"] + "/ws_ab.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("tree", "format", "sessions", "starved_sessions", "starved_ms_total", "dry_at_audio_s", "xrt")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "ff95": d["first_text_to_first_frame_ms"].get("p95")}))
PY
cat $OUT/bursts.jsonl
grep -h "warmed up\|serves" $OUT/bench_err.txt $OUT/ws_err.txt | cut -c1-200
grep -v "uvicorn.error\|SyntaxWarning\|is not 0\|connection closed\|draining" $OUT/ws_err.txt | tail -c 800
