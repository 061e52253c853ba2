# Session 19, call 1: the VAE's row-wise kernels told when their rows are 16-byte aligned (ALIGNED; vectorised
# loads and stores), the depthwise conv's context loads only in the tiles that reach into the context. GPU tests of
# the kernels and the model; vae_bench (passes at each block's shapes, the decode as a graph) on the tree before
# (.carry/base) and this one at B=1,024; rope_attention_bench --sweep at B=1,024; bench_engine FP8 c=1,024 base/new.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "snake or conv or residual or rope or attention" > $OUT/gpu_tests.txt 2>&1; t gpu_kernel_tests $?
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/models/voxcpm/test_model_gpu.py tests/engine/models/voxcpm/test_parity_gpu.py >> $OUT/gpu_tests.txt 2>&1; t gpu_model_tests $?
timeout 120 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/vae_bench.py --batch 1024 > $OUT/vae.jsonl 2>>$OUT/err.txt; t vae $?
timeout 110 python3 benchmarks/rope_attention_bench.py --batch 1024 --keep 11 --sweep > $OUT/rope_sweep.jsonl 2>>$OUT/err.txt; t sweep $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
timeout 160 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F > $OUT/bench.jsonl 2>>$OUT/err.txt; t bench $?
grep -E 'passed|failed|FAILED|Error' $OUT/gpu_tests.txt | tail -12
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
rows = {}
for l in open(out + "/vae.jsonl"):
    d = json.loads(l)
    if d.get("pass") or d.get("vae"):
        key = (d.get("channels"), d.get("kernel", "vae"))
        rows.setdefault(key, {})[d["tree"]] = d["ms"]
for (c, k), v in rows.items():
    print("vae", c, k, v, round(v.get("new", 0) / v["base"], 3) if "base" in v else "")
for l in open(out + "/rope_sweep.jsonl"):
    print("rope", l.strip())
for l in open(out + "/bench.jsonl"):
    if '"concurrency"' in l:
        d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate")}))
PY
tail -3 $OUT/err.txt
