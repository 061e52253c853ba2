# Session 15, call 1: few_rows_configs.py (every launch config per one-stream shape), then the Qwen3 few-rows A/B.
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 120 python3 benchmarks/few_rows_configs.py > $OUT/few_rows_configs.jsonl 2>>$OUT/err.txt; t configs $?
bash .carry/next_qwen3_ab.sh  # benchmarks/results/h200-2026-11-29c/call1_qwen3_ab.sh
