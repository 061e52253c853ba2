source scripts/device_env.sh >/dev/null
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt
timeout 75 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 512 --max-num-seqs 512 --fp8-gemms on 2>>$OUT/err.txt | grep '^{' > $OUT/bench_engine.jsonl
cut -c1-400 $OUT/bench_engine.jsonl
