# 29th session, call 2: a burst's arrivals prefilled ahead of its first step while it still arrives (EngineConfig.
# prefill_ahead_tokens, 8192) against none (0), issue 16's c=1,024 run, two interleaved pairs in one tree, with step
# traces; first the GPU tests of the CUDA graphs.
source scripts/device_env.sh > /tmp/gpu.txt; tee $OUT/log.txt < /tmp/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>/tmp/err.txt; touch /tmp/c2.done) &
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_cuda_graphs.py -rA 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" > $OUT/gpu_tests.txt; t gpu_tests $?
cat $OUT/gpu_tests.txt
while [ ! -f /tmp/c2.done ]; do sleep 1; done; t checkpoint 0
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2; do
  for a in 0 8192; do
    timeout 100 python3 benchmarks/bench_engine.py $F --prefill-ahead-tokens $a --concurrency 1024 --step-trace $OUT/trace_r${r}_$a.jsonl 2>>/tmp/err.txt | grep '"concurrency"' | sed "s/^{/{\"r\": $r, /" | tee -a $OUT/bench.jsonl | cut -c1-150; t r${r}_$a $?
    python3 benchmarks/results/h100-2026-12-07b/span.py $OUT/trace_r${r}_$a.jsonl | tee -a $OUT/spans.jsonl | cut -c1-400
  done
done
tail -3 /tmp/err.txt
