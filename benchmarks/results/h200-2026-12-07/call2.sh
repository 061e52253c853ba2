# Second call (H100 or H200): call1 found the warp-specialised gate/up kernel wrong (Triton 3.6's Hopper partition),
# so the tree sent keeps the engine's kernel and carries the rest: the LMs' MLPs block-scaled through that kernel
# under --fp8-backbone, and whole-prompt prefills attending through flash-attn's dense varlen kernel. Steps: the GPU
# tests of both; the kernel against cuBLAS + SiLU*mul at the LMs' admission shapes; one c=1,024 A/B pair with step
# traces (admissions apart from decode steps). Cut to fit the session's last device minutes: no c=1 line (call1's
# tree had both changes: 10.3 and 9.7 ms).
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py tests/engine/models/voxcpm/test_fp8.py tests/engine/attention/test_attention_gpu.py -k "gate_up_silu_fp8 or fp8_drift or paged_prefill" -rA 2>&1 | grep -E "^(PASSED|FAILED|ERROR)|passed|failed" > $OUT/gpu_tests.txt; t gpu_tests $?
cat $OUT/gpu_tests.txt
timeout 30 python3 benchmarks/gate_up_bench.py --batch 1024 --k 2048 --n 6144 --rows-per-stream 90 2>>$OUT/err.txt | grep '"ms"' > $OUT/gate_up_lm.jsonl; t lm_bench $?
cat $OUT/gate_up_lm.jsonl
while [ ! -f /tmp/c2.done ]; do sleep 1; done; t checkpoint 0
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
timeout 170 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace.jsonl 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/bench.jsonl; t ab $?
cut -c1-330 $OUT/bench.jsonl
python3 benchmarks/results/h200-2026-12-03d/bursts.py $OUT/bench.jsonl $OUT/trace.jsonl
tail -3 $OUT/err.txt
