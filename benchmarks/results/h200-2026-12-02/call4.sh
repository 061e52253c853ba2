# Session 19, call 4: bench_engine FP8 at c = 1 and 1,024, the tree before the session (.carry/base) and this one
# (ROPE_ATTENTION_LARGE_GRID as call 3 chose it: (8, 128)), one pair more.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1 1024"
timeout 200 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F > $OUT/bench.jsonl 2>>$OUT/err.txt; t bench $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench.jsonl"):
    if '"concurrency"' in l:
        d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate")}))
PY
tail -3 $OUT/err.txt
