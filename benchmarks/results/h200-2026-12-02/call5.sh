# Session 19, call 5: compare_anchor.sh for VoxCPM2 (ours bf16 against nano-vllm-voxcpm, c = 1 256 512,
# --max-num-seqs 512) on this tree.
source scripts/device_env.sh > $OUT/gpu.txt
[ -f /tmp/c2/config.json ] && ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2  # the same full-size random checkpoint, still there when the machine is warm
BENCH_ARGS="--max-num-seqs 512" timeout 200 bash benchmarks/compare_anchor.sh voxcpm2 .carry/anchor 60 "1 256 512" > /dev/null 2>>$OUT/err.txt; echo compare rc=$?
rm -f $OUT/compare-voxcpm2/gpu.txt
cat $OUT/compare-voxcpm2/ratios.md
tail -3 $OUT/err.txt
