# Session 16, call 6: the VAE's Snakes applied by the passes before them (working tree) against 7638a81 (.carry/base):
# GPU tests of the new kernels and the VAE's parity; the streaming VAE decode graph at B = 512, 1,024 (vae_bench.py),
# alternating twice; bench_engine FP8 c=1,024 on each with a step trace.
source scripts/device_env.sh >/dev/null
ROOT=$PWD
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
[ -f /tmp/c2/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 150 python3 -m pytest -q -m gpu tests/engine/kernels/test_kernels_gpu.py -k "pointwise_residual or causal_conv_transpose or snake" tests/engine/models/voxcpm/test_parity_gpu.py -k "vae or pointwise or transpose or snake" -p no:cacheprovider 2>&1 | tail -6 > $OUT/gpu_tests.txt; t gpu_tests $?
for i in 1 2; do
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH python3 $ROOT/.carry/vae_bench.py /tmp/c2 512 1024 2>>$OUT/err.txt | sed 's/^{/{"tree": "base", /') >> $OUT/vae.jsonl; t vbase$i $?
  python3 .carry/vae_bench.py /tmp/c2 512 1024 2>>$OUT/err.txt | sed 's/^{/{"tree": "new", /' >> $OUT/vae.jsonl; t vnew$i $?
done
B="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
(cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 100 python3 benchmarks/bench_engine.py $B --step-trace $OUT/trace_base.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /') >> $OUT/bench.jsonl; t base $?
timeout 100 python3 benchmarks/bench_engine.py $B --step-trace $OUT/trace_new.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench.jsonl; t new $?
cat $OUT/gpu_tests.txt $OUT/vae.jsonl
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for l in open(out + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
for tree in ("base", "new"):
    steps = [json.loads(l) for l in open(f"{out}/trace_{tree}.jsonl")]
    full = [s["ms"] for s in steps if s["batch"] == 1024 and not s["admitted"]]
    print(tree, "B1024 steps", len(full), "median", statistics.median(full))
PY
tail -3 $OUT/err.txt
