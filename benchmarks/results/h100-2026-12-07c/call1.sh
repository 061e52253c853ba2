# The GIL's switch interval against the loop thread's host work (every torch op gives the GIL up and, beside a busy
# thread, waits a whole interval to take it back): issue 16's c=1,024 run at 500 us (the engine process's interval
# today) and 100 us with prefill ahead 8192, and 100 us with it off; two rounds, step traces; c=1 at 100 us.
# VARIANTS="500:8192 100:8192" NO_C1=1 (the call that ran: ~230 s, what the session had left).
# First admission.py: a c=1,024 first step by piece, and a prefill ahead's host time beside a busy thread.
source scripts/device_env.sh > /tmp/gpu.txt; tee $OUT/log.txt < /tmp/gpu.txt
D=benchmarks/results/h100-2026-12-07c
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>/tmp/err.txt; t checkpoint $?
timeout 120 python3 $D/admission.py /tmp/c2 500 100 50 2>>/tmp/err.txt | tee $OUT/admission.jsonl | cut -c1-250; t admission $?
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2; do
  for v in ${VARIANTS:-500:8192 100:8192 100:0}; do
    s=${v%:*}; a=${v#*:}; tr=$OUT/trace_r${r}_${s}_$a.jsonl
    timeout 100 python3 benchmarks/bench_engine.py $F --switch-interval-us $s --prefill-ahead-tokens $a --concurrency 1024 --step-trace $tr 2>>/tmp/err.txt | grep '"concurrency"' | sed "s/^{/{\"r\": $r, /" | tee -a $OUT/bench.jsonl | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('r','switch_interval_us','prefill_ahead_tokens','ttfb_p50_ms','rtf_mean','rtf_p90','xrt_aggregate')})"; t r${r}_${s}_$a $?
    python3 $D/steps.py $tr | tee -a $OUT/spans.jsonl | cut -c1-400
    gzip $tr
  done
done
[ -n "$NO_C1" ] || timeout 60 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --switch-interval-us 100 --concurrency 1 1 --warmup 2 2>>/tmp/err.txt | grep '"concurrency"' > $OUT/c1.jsonl; t c1 $?
cut -c1-200 $OUT/c1.jsonl
tail -3 /tmp/err.txt
