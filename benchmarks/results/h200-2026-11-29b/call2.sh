# Session 14, call 2: bf16 GEMMs of few rows, cuBLAS against a weight-streaming Triton kernel.
source scripts/device_env.sh >/dev/null
timeout 400 python3 benchmarks/results/h200-2026-11-29b/skinny_gemm_bench.py 2>$OUT/err.txt | tee $OUT/skinny.jsonl
tail -3 $OUT/err.txt
