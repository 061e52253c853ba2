source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
timeout 150 python3 -m pytest -q -x tests/engine/kernels/test_kernels_gpu.py -k dense_attention 2>&1 | tail -15 > $OUT/dense_tests.txt; t dense_tests $?
cat $OUT/dense_tests.txt | tail -4
timeout 200 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 512 --max-num-seqs 512 --fp8-gemms on 2>$OUT/err_b.txt | grep '^{' > $OUT/bench_ab.jsonl; t bench_ab $?
cut -c1-330 $OUT/bench_ab.jsonl
timeout 240 python3 -m pytest -q -m gpu tests/engine 2>&1 | tail -25 > $OUT/gpu_tests.txt; t gpu_tests $?
tail -4 $OUT/gpu_tests.txt
timeout 100 python3 benchmarks/profile_step.py --model $C --batch 512 --fp8-gemms on --top 14 2>$OUT/err_p.txt | grep '^{' > $OUT/profile.jsonl; t profile $?
cut -c1-2500 $OUT/profile.jsonl
