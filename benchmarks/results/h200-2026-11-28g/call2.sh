source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
timeout 400 python3 benchmarks/profile_step.py --model $C --batch 1 256 512 --fp8-gemms on --top 12 2>$OUT/err_p.txt | grep --line-buffered '^{' > $OUT/profile.jsonl; t profile $?
cat $OUT/profile.jsonl
grep -v "^\s" $OUT/err_p.txt | grep -v Warning | tail -5
