# 29th session, call 1 (on an H200 if one comes): issue 16's c=1,024 run, three interleaved pairs, main (bb649e7: the burst
# window's arrivals no longer wake the engine loop; text-only prompts hold no zero latents) against b0add5e, with step
# traces (the arrival span and the admission are the measure); then c=1 TTFB.
#   python benchmarks/ab_trees.py prepare --ref b0add5e --out .carry/base     (carry .carry)
source scripts/device_env.sh > /tmp/gpu.txt; tee $OUT/log.txt < /tmp/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>/tmp/err.txt; t checkpoint $?
ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2  # compare_anchor.sh's path, for a follow-up call on the warm machine
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2 3; do
  timeout 170 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_r$r.jsonl 2>>/tmp/err.txt | grep '"concurrency"' | sed "s/^{/{\"r\": $r, /" > $OUT/bench_r$r.jsonl; t ab$r $?
  python3 benchmarks/results/h200-2026-12-03d/bursts.py $OUT/bench_r$r.jsonl $OUT/trace_r$r.jsonl | tee -a $OUT/bursts.jsonl
  cat $OUT/bench_r$r.jsonl >> $OUT/bench.jsonl; rm $OUT/bench_r$r.jsonl
done
timeout 60 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --concurrency 1 1 --warmup 2 2>>/tmp/err.txt | grep '"concurrency"' > $OUT/c1.jsonl; t c1 $?
cut -c1-200 $OUT/c1.jsonl
tail -3 /tmp/err.txt
