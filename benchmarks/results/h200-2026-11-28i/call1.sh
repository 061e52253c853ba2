source scripts/device_env.sh >/dev/null
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 python3 .carry/next_gate_up_blockquant_bench.py > $OUT/gateup.jsonl 2>> $OUT/err.txt; echo "gateup rc=$? $(( $(date +%s)-T0 ))s"
cat $OUT/gateup.jsonl; tail -5 $OUT/err.txt
bash .carry/next_one_session_ab.sh
cat $OUT/log.txt; tail -5 $OUT/err.txt
