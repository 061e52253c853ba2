source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 512 --format opus pcm_s16le --sample-rate 48000 24000 --client-processes 4"
for r in 1; do
rm -rf trace .carry/base/trace
timeout 300 python3 benchmarks/ab_trees.py run --base .carry/base -- $WS "--server-args=--fp8-gemms on --step-trace-dir trace" 2>>$OUT/err.txt | grep '^{' | sed 's/^{/{"r":'$r',/' >> $OUT/ws_ab.jsonl; t ab$r $?
for tr in base new; do d=trace; [ $tr = base ] && d=.carry/base/trace; grep '"r":'$r',"tree": *"'$tr'"' $OUT/ws_ab.jsonl | sed 's/^{"r":[0-9],"tree": *"[a-z]*", */{/' > /tmp/lv_$tr.jsonl; python3 benchmarks/step_trace.py --trace $d/engine-0.jsonl --levels /tmp/lv_$tr.jsonl --admissions 3 | sed 's/^/{"r":'$r',"tree":"'$tr'","trace":/; s/$/}/' >> $OUT/trace_summary.jsonl; sed 's/^/{"r":'$r',"tree":"'$tr'","step":/; s/$/}/' $d/engine-0.jsonl >> $OUT/trace.jsonl; done
done
gzip $OUT/trace.jsonl
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/ws_ab.jsonl"):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({k: d.get(k) for k in ("r", "tree", "format", "sessions", "starved_sessions", "starved_ms_total", "xrt")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "ff95": d["first_text_to_first_frame_ms"].get("p95")}))
PY
cut -c1-600 $OUT/trace_summary.jsonl | grep '"sessions":512'
grep -v "uvicorn.error\|SyntaxWarning\|is not 0\|connection closed\|draining" $OUT/err.txt | tail -c 1000
