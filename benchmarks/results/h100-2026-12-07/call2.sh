# 28th session, call 2 (one H100, after call 1 = ../h200-2026-12-07/next_call.sh): compare_anchor.sh for VoxCPM2 on
# main (ours bf16 against nano-vllm-voxcpm, c = 1 8 64 256 512, --max-num-seqs 512), then ours as issue 16 runs it
# (FP8 LocDiT GEMMs and admission backbone, the server's burst window) at c=1,024.
source scripts/device_env.sh > $OUT/gpu.txt; cat $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
[ -f /tmp/c2/config.json ] && ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2  # call 1's checkpoint when the machine is still warm
BENCH_ARGS="--max-num-seqs 512" timeout 360 bash benchmarks/compare_anchor.sh voxcpm2 .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>$OUT/err.txt; t compare $?
F="--model /tmp/ckpt-voxcpm2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
timeout 100 python3 benchmarks/bench_engine.py $F --concurrency 1024 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/fp8.jsonl; t fp8 $?
rm -f $OUT/compare-voxcpm2/gpu.txt
cat $OUT/compare-voxcpm2/ratios.md; cut -c1-220 $OUT/fp8.jsonl
tail -3 $OUT/err.txt
