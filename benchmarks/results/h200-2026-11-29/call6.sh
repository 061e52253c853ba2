# Call 6 (main, 86f50fb): the warps sweep of the attention block's three memory-bound kernels at B=512's shapes.
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
timeout 150 python3 benchmarks/results/h200-2026-11-29/kernel_warps_bench.py 2>>$OUT/err.txt | tee $OUT/warps.jsonl; t warps $?
