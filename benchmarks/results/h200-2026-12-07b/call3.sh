# The 31st session's call 3: compare_anchor.sh for voxcpm-0.5b (ours bf16 against
# nano-vllm-voxcpm, c = 1 8 64 256 512, --max-num-seqs 512).
source scripts/device_env.sh > $OUT/gpu.txt; cat $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
BENCH_ARGS="--max-num-seqs 512" timeout 300 bash benchmarks/compare_anchor.sh voxcpm-0.5b .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>$OUT/err.txt; t compare $?
rm -f $OUT/compare-voxcpm-0.5b/gpu.txt; cat $OUT/compare-voxcpm-0.5b/ratios.md
grep -v -e "W1207" -e "^$" $OUT/err.txt | tail -3
