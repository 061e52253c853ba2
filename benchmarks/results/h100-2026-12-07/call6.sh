# 28th session, call 6: the burst window's arrivals no longer wake the engine loop (main) against b0add5e (before it),
# issue 16's c=1,024 run, interleaved pairs with step traces: the arrival span and the admissions are the measure.
#   python benchmarks/ab_trees.py prepare --ref b0add5e --out .carry/base
source scripts/device_env.sh > $OUT/gpu.txt; cat $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t checkpoint $?
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2; do
  timeout 120 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_r$r.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed "s/^{/{\"r\": $r, /" > $OUT/bench_r$r.jsonl; t ab$r $?
  python3 benchmarks/results/h200-2026-12-03d/bursts.py $OUT/bench_r$r.jsonl $OUT/trace_r$r.jsonl
done
