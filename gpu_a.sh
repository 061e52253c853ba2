set -u
source scripts/device_env.sh > $OUT/env.log 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 > $OUT/ckpt.log 2>&1 &
CK=$!
timeout 200 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py tests/engine/models/voxcpm/test_fp8.py tests/engine/lora -k "fp8 or quantize or lora" > $OUT/gpu_tests_fp8.txt 2>&1
tail -3 $OUT/gpu_tests_fp8.txt
wait $CK
for f in off on; do timeout 150 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --concurrency 1 1 256 512 --max-num-seqs 512 --fp8-gemms $f >> $OUT/bench_fp8.jsonl 2>>$OUT/bench.err; done
cat $OUT/bench_fp8.jsonl
timeout 120 python3 benchmarks/profile_step.py --model /tmp/c2 --batch 256 512 --fp8-gemms on --top 12 > $OUT/profile_fp8.jsonl 2> $OUT/profile.err
cut -c1-600 $OUT/profile_fp8.jsonl
C="--model /tmp/c2 --max-patches 60 --format opus --sample-rate 48000 --workers 12 --client-processes 2 --sessions 256"
timeout 90 python3 benchmarks/ws_latency.py --device 0 $C > $OUT/ws_coalesce.jsonl 2> $OUT/ws.err
timeout 90 python3 benchmarks/ws_latency.py --device 0 $C --server-args="--coalesce-ms 5 --coalesce-max-ms 150" >> $OUT/ws_coalesce.jsonl 2>> $OUT/ws.err
cut -c1-900 $OUT/ws_coalesce.jsonl
