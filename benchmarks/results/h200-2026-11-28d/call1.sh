source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 512 --format opus pcm_s16le --sample-rate 48000 24000 --client-processes 4"
rm -rf trace .carry/base/trace
timeout 300 python3 benchmarks/ab_trees.py run --base .carry/base -- $WS "--server-args=--fp8-gemms on --step-trace-dir trace" 2>>$OUT/err.txt | grep '^{' >> $OUT/ws_ab.jsonl; t ab $?
for tr in base new; do d=trace; [ $tr = base ] && d=.carry/base/trace; grep '"tree": *"'$tr'"' $OUT/ws_ab.jsonl | sed 's/^{"tree": *"[a-z]*", */{/' > /tmp/lv_$tr.jsonl; python3 benchmarks/step_trace.py --trace $d/engine-0.jsonl --levels /tmp/lv_$tr.jsonl --admissions 6 | sed 's/^/{"tree":"'$tr'","trace":/; s/$/}/' >> $OUT/trace_summary.jsonl; sed 's/^/{"tree":"'$tr'","step":/; s/$/}/' $d/engine-0.jsonl >> $OUT/trace.jsonl; done; gzip $OUT/trace.jsonl
cat $OUT/trace_summary.jsonl
grep -v "uvicorn.error\|SyntaxWarning\|is not 0\|connection closed\|draining" $OUT/err.txt | tail -c 1000
