# 28th session, call 3 (the same H100 as call 2): compare_anchor.sh for VoxCPM1.5 and VoxCPM-0.5B on main (ours bf16
# against nano-vllm-voxcpm, c = 1 64 256 512, --max-num-seqs 512).
source scripts/device_env.sh > $OUT/gpu.txt; cat $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
for v in voxcpm1.5 voxcpm-0.5b; do
  BENCH_ARGS="--max-num-seqs 512" timeout 250 bash benchmarks/compare_anchor.sh $v .carry/anchor 60 "1 64 256 512" > /dev/null 2>>$OUT/err.txt; t $v $?
  rm -f $OUT/compare-$v/gpu.txt; cat $OUT/compare-$v/ratios.md
done
grep -v -e "W1207" -e "^$" $OUT/err.txt | tail -3
