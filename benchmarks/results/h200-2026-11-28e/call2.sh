source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
VOX_EXP_PROF=$OUT timeout 200 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 512 --max-num-seqs 512 --fp8-gemms on --pace-admissions on 2>$OUT/err.txt | grep '^{' > $OUT/bench.jsonl; t bench $?
grep EXP $OUT/err.txt
for n in 1 2 3; do head -c 9000 $OUT/prof$n.txt; done
gzip $OUT/prof*.json
tail -c 600 $OUT/err.txt
