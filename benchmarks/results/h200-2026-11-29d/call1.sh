# Session 16, call 1: where a c=1,024 burst's 12 s go. bench_engine FP8 c=1024 with a step trace, then
# profile_step at B=512 and 1,024 (FP8) with the top kernels of an eager step and of an admission.
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 150 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --concurrency 1024 --max-num-seqs 1024 --fp8-gemms on --step-trace $OUT/trace1024.jsonl 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/bench.jsonl; t bench $?
timeout 300 python3 benchmarks/profile_step.py --model /tmp/c2 --batch 512 1024 --steps 4 --fp8-gemms on --top 40 > $OUT/profile.jsonl 2>>$OUT/err.txt; t profile $?
cat $OUT/bench.jsonl
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/profile.jsonl"):
    d = json.loads(l); d.pop("kernels_eager", None); d.pop("kernels_admit", None); print(json.dumps(d))
PY
tail -3 $OUT/err.txt
