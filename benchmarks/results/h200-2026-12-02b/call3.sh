# Session 20, call 3: compare_anchor.sh for VoxCPM2 (ours bf16 against nano-vllm-voxcpm, c = 1 8 64 256 512,
# --max-num-seqs 512) on this tree, then ours with --fp8-gemms on at c=1,024 (--max-num-seqs 1024).
source scripts/device_env.sh > $OUT/gpu.txt
[ -f /tmp/c2/config.json ] && ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2  # the same full-size random checkpoint, still there when the machine is warm
BENCH_ARGS="--max-num-seqs 512" timeout 330 bash benchmarks/compare_anchor.sh voxcpm2 .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>$OUT/err.txt; echo compare rc=$?
timeout 90 python3 benchmarks/bench_engine.py --model /tmp/ckpt-voxcpm2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/fp8.jsonl; echo fp8 rc=$?
rm -f $OUT/compare-voxcpm2/gpu.txt
cat $OUT/compare-voxcpm2/ratios.md $OUT/fp8.jsonl
tail -3 $OUT/err.txt
