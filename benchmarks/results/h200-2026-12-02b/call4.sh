# Session 20, call 4: compare_anchor.sh for VoxCPM1.5 and VoxCPM-0.5B (ours bf16 against nano-vllm-voxcpm, c = 1 64
# 256 512, --max-num-seqs 512) on this tree, one after the other in this call.
source scripts/device_env.sh > $OUT/gpu.txt
for v in voxcpm1.5 voxcpm-0.5b; do
  BENCH_ARGS="--max-num-seqs 512" timeout 240 bash benchmarks/compare_anchor.sh $v .carry/anchor 60 "1 64 256 512" > /dev/null 2>>$OUT/err.txt; echo compare $v rc=$?
  rm -f $OUT/compare-$v/gpu.txt; cat $OUT/compare-$v/ratios.md
done
tail -3 $OUT/err.txt
