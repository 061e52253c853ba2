# For a next session's first call (this session got no device machine: every start failed). Here first:
#   python benchmarks/ab_trees.py prepare --ref HEAD --out .carry/base
#   git apply benchmarks/results/h200-2026-12-07/ws_gate_up.patch
# then on the H200 (carry .carry): bash benchmarks/results/h200-2026-12-07/next_call.sh
# The patch: the gate/up kernel persistent and warp-specialised (Triton 3.6's Hopper autoWS: a TMA producer group and
# two consumer groups taking half a tile's rows each, so the producer fetches the next tile while the consumers run
# this one's SiLU, quantising and stores), and the LMs' MLPs block-scaled through it under --fp8-backbone; and (the
# working tree, next session) whole-prompt prefills attending through flash-attn's dense varlen kernel instead of the
# paged split-KV one. Steps: the GPU tests, the kernel's launch sweep against the base kernel and cuBLAS (LocDiT
# shapes) and at the LMs' admission shapes; then, with the best launch in the tree sent if one beats the base kernel,
# the engine A/B at c=1,024 with step traces (two pairs; one if no launch won, for the admission) and c=1 TTFB.
source scripts/device_env.sh > $OUT/gpu.txt
R=benchmarks/results/h200-2026-12-07
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py tests/engine/models/voxcpm/test_fp8.py tests/engine/attention/test_attention_gpu.py -k "gate_up_silu_fp8 or fp8_drift or paged_prefill" > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -3
(cd .carry/base && timeout 60 python3 benchmarks/gate_up_bench.py --batch 512 1024) 2>>$OUT/err.txt | grep '"ms"' | sed 's/^{/{"tree": "base", /' > $OUT/gate_up.jsonl; t base_bench $?
timeout 150 python3 benchmarks/gate_up_bench.py --batch 512 1024 --sweep 2>>$OUT/err.txt | grep '"ms"' | sed 's/^{/{"tree": "new", /' >> $OUT/gate_up.jsonl; t new_bench $?
timeout 60 python3 benchmarks/gate_up_bench.py --batch 1024 --k 2048 --n 6144 --rows-per-stream 90 2>>$OUT/err.txt | grep '"ms"' | sed 's/^{/{"tree": "new", /' > $OUT/gate_up_lm.jsonl; t lm_bench $?
cat $OUT/gate_up.jsonl $OUT/gate_up_lm.jsonl
# No launch beats the base kernel: one pair only, for the admission (its attention and LM MLPs changed too).
python3 $R/pick_launch.py $OUT/gate_up.jsonl || { tail -5 $OUT/err.txt; PAIRS=1; }
while [ ! -f /tmp/c2.done ]; do sleep 1; done; t checkpoint 0
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in $(seq 1 ${PAIRS:-2}); do
  timeout 170 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_r$r.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed "s/^{/{\"r\": $r, /" >> $OUT/bench.jsonl; t ab$r $?
  python3 benchmarks/results/h200-2026-12-03d/bursts.py $OUT/bench.jsonl $OUT/trace_r$r.jsonl | tail -2
done
timeout 60 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --concurrency 1 1 --warmup 2 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/c1.jsonl; t c1 $?
cut -c1-200 $OUT/c1.jsonl
tail -3 $OUT/err.txt
