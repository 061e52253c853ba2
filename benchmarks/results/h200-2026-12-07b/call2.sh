# The 31st session's call 2: the fixed GPU test of the backbone graphs (the ahead key's slots), then compare_anchor.sh for voxcpm1.5 (ours bf16 against
# nano-vllm-voxcpm, c = 1 8 64 256 512, --max-num-seqs 512).
source scripts/device_env.sh > $OUT/gpu.txt; cat $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
timeout 90 python3 -m pytest -q -m gpu tests/engine/test_cuda_graphs.py -k "prefill_backbone_matches_eager" 2>&1 | tail -2 | tee $OUT/gpu_test.txt; t gpu_test $?
BENCH_ARGS="--max-num-seqs 512" timeout 300 bash benchmarks/compare_anchor.sh voxcpm1.5 .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>$OUT/err.txt; t compare $?
rm -f $OUT/compare-voxcpm1.5/gpu.txt; cat $OUT/compare-voxcpm1.5/ratios.md
grep -v -e "W1207" -e "^$" $OUT/err.txt | tail -3
