# Session 25, call 1 (the session's one call: 414 s of device time were left): the channels-last streaming upsampling
# (h200-2026-12-03c/call5/channels_last_upsampling.patch, applied to the tree sent) against main at 2e69de1
# (.carry/base), bench_engine c=1,024 interleaved, with step traces: call 5's one pair there had the new tree's
# TTFB p50 ~195 ms later, which a burst cut by its window's cap would explain and its decode steps would not show.
# First the upsampling's GPU kernel tests, while the checkpoint is made; one pair; then profile_step per tree.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "conv_transpose" > $OUT/gpu_tests.txt 2>&1; t gpu_kernels $?
grep -E "passed|failed" $OUT/gpu_tests.txt | tail -2
while [ ! -f /tmp/c2.done ]; do sleep 1; done; t checkpoint 0
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
timeout 150 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_r1.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"r":1, /' >> $OUT/bench.jsonl; t ab1 $?
python3 benchmarks/results/h200-2026-12-03d/bursts.py $OUT/bench.jsonl $OUT/trace_r1.jsonl | tee $OUT/bursts.jsonl
# Then, with what time is left, where a B=1,024 step's time goes in each tree (the VAE's graph, the eager kernels).
timeout 200 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/profile_step.py --model /tmp/c2 --batch 1024 --fp8-gemms on --fp8-backbone on --top 30 2>>$OUT/err.txt | grep '"batch"' > $OUT/profile.jsonl; t profile $?
python3 -c "
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l); print(json.dumps({k: v for k, v in d.items() if not isinstance(v, (list, dict))}))
" $OUT/profile.jsonl
tail -3 $OUT/err.txt
