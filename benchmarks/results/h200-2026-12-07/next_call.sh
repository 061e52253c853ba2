# For a next session's first call, on an H200 (this session's two machines were H100s). Here first:
#   python benchmarks/ab_trees.py prepare --ref f9b237d --out .carry/base      (main before the admission changes)
# then on the GPU (carry .carry): bash benchmarks/results/h200-2026-12-07/next_call.sh
# The admission changes merged in bd329fa (the LMs' MLPs through the fused gate/up kernel under --fp8-backbone,
# context-free prefills through flash-attn's dense varlen kernel) took 7-17 ms off a c=1,024 admission on an H100,
# within the noise end to end. On the H200, where issue 16's target stands: the gate/up kernel's GPU test at the LMs'
# shape (added after call 2, not yet run), three interleaved c=1,024 pairs with step traces, c=1 TTFB.
source scripts/device_env.sh > /tmp/gpu.txt; tee $OUT/log.txt < /tmp/gpu.txt  # the GPU line first (8 files come back)
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>/tmp/err.txt; touch /tmp/c2.done) &
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py tests/engine/models/voxcpm/test_fp8.py tests/engine/attention/test_attention_gpu.py -k "gate_up_silu_fp8 or fp8_drift or paged_prefill" -rA 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" > $OUT/gpu_tests.txt; t gpu_tests $?
cat $OUT/gpu_tests.txt
while [ ! -f /tmp/c2.done ]; do sleep 1; done; t checkpoint 0
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2 3; do
  timeout 170 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_r$r.jsonl 2>>/tmp/err.txt | grep '"concurrency"' | sed "s/^{/{\"r\": $r, /" > $OUT/bench_r$r.jsonl; t ab$r $?
  python3 benchmarks/results/h200-2026-12-03d/bursts.py $OUT/bench_r$r.jsonl $OUT/trace_r$r.jsonl
  cat $OUT/bench_r$r.jsonl >> $OUT/bench.jsonl; rm $OUT/bench_r$r.jsonl
done
timeout 60 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --concurrency 1 1 --warmup 2 2>>/tmp/err.txt | grep '"concurrency"' > $OUT/c1.jsonl; t c1 $?
cut -c1-200 $OUT/c1.jsonl
tail -3 /tmp/err.txt
