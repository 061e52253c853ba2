# For the next session's first call, on an H200 (carry .carry; no base tree needed): prefill ahead now that the loop
# wakes at its threshold (7be180e: request ids and drawn seeds no longer from os.urandom), off / 8192 (the default) /
# 32768 (fewer passes, less of the loop's host work while the burst still arrives: 8192 is ~11 passes of ~91 requests
# per 1,024-request burst, unmeasured on a GPU; watch the arrival span against the window's 150 ms cap), two rounds of
# issue 16's c=1,024 run, with step traces; then c=1 TTFB. ~6 min.
source scripts/device_env.sh > /tmp/gpu.txt; tee $OUT/log.txt < /tmp/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>/tmp/err.txt; t checkpoint $?
ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2  # compare_anchor.sh's path, for a follow-up call on the warm machine
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2; do
  for a in 0 8192 32768; do
    timeout 100 python3 benchmarks/bench_engine.py $F --prefill-ahead-tokens $a --concurrency 1024 --step-trace $OUT/trace_r${r}_$a.jsonl 2>>/tmp/err.txt | grep '"concurrency"' | sed "s/^{/{\"r\": $r, /" | tee -a $OUT/bench.jsonl | cut -c1-150; t r${r}_$a $?
    python3 benchmarks/results/h100-2026-12-07b/span.py $OUT/trace_r${r}_$a.jsonl | tee -a $OUT/spans.jsonl | cut -c1-600
  done
done
timeout 60 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --concurrency 1 1 --warmup 2 2>>/tmp/err.txt | grep '"concurrency"' > $OUT/c1.jsonl; t c1 $?
cut -c1-200 $OUT/c1.jsonl
tail -3 /tmp/err.txt
