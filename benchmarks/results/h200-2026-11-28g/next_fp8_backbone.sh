# The measurement of --fp8-backbone (d099d63); run as the eleventh session's call 1 (../h200-2026-11-28h). One call (~450 s):
#   scripts/prepare_device_carry.sh; then bash .carry/next_fp8_backbone.sh with carry [".carry"].
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
for backbone in off on; do
  timeout 150 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 512 1024 --max-num-seqs 1024 \
    --fp8-gemms on --fp8-backbone $backbone 2>>$OUT/err_b.txt | grep '^{' >> $OUT/bench.jsonl; t bench_$backbone $?
done
timeout 90 python3 benchmarks/profile_step.py --model $C --batch 512 --fp8-gemms on --fp8-backbone on --top 12 2>$OUT/err_p.txt | grep '^{' > $OUT/profile.jsonl; t profile $?
timeout 120 python3 -m pytest -q -m gpu tests/engine/models/voxcpm/test_fp8.py 2>&1 | tail -3 > $OUT/gpu_tests.txt; t gpu_tests $?
cut -c1-400 $OUT/bench.jsonl | grep concurrency; cut -c1-1200 $OUT/profile.jsonl; cat $OUT/gpu_tests.txt
