# The 31st session's second call: the failing GPU test of call 0 in full, then compare_anchor.sh for VoxCPM2 (ours
# bf16 against nano-vllm-voxcpm, c = 1 8 64 256 512, --max-num-seqs 512) and issue 16's run at c=1,024.
source scripts/device_env.sh > $OUT/gpu.txt; cat $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
timeout 90 python3 -m pytest -q -x -m gpu tests/engine/test_cuda_graphs.py -k "prefill_backbone_matches_eager" 2>&1 | tail -60 > $OUT/gpu_test.txt; t gpu_test $?
grep -E "^E |Error|passed|failed" $OUT/gpu_test.txt | head -30
[ -f /tmp/c2/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt
ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2
BENCH_ARGS="--max-num-seqs 512" timeout 330 bash benchmarks/compare_anchor.sh voxcpm2 .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>$OUT/err.txt; t compare $?
rm -f $OUT/compare-voxcpm2/gpu.txt
cat $OUT/compare-voxcpm2/ratios.md
tail -3 $OUT/err.txt
