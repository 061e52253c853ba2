# Session 20, call 1: the fused attention reading each RoPE table row's first half only (the tables repeat it). GPU
# kernel tests (rope, attention); rope_attention_bench --sweep at B=1,024 (the best FP8 launch of the whole group
# written into ROPE_ATTENTION_LARGE_GRID here); the engine's launch base and new at B=512, 1,024; bench_engine FP8
# c=1,024 base, new, base, new with step traces; the model's GPU and parity tests.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "rope or attention" > $OUT/gpu_tests.txt 2>&1; t gpu_kernel_tests $?
timeout 70 python3 benchmarks/rope_attention_bench.py --batch 1024 --keep 11 --sweep > $OUT/rope_sweep.jsonl 2>>$OUT/err.txt; t sweep $?
python3 - <<'PY' | tee -a $OUT/log.txt
import json, os, re
lines = [json.loads(l) for l in open(os.environ["OUT"] + "/rope_sweep.jsonl") if '"fused_fp8"' in l]
best = min((d for d in lines if d["heads_per_program"] == 8), key=lambda d: d["ms"])
print("best fp8 launch", best)
path = "engine/kernels/triton_ops.py"
s = open(path).read()
new = f"ROPE_ATTENTION_LARGE_GRID = ({best['warps']}, {best['max_registers']})"
open(path, "w").write(re.sub(r"^ROPE_ATTENTION_LARGE_GRID = .*$", new, s, flags=re.M))
PY
grep "^ROPE_ATTENTION_LARGE_GRID" engine/kernels/triton_ops.py | tee -a $OUT/log.txt
timeout 60 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/rope_attention_bench.py --batch 512 1024 > $OUT/rope.jsonl 2>>$OUT/err.txt; t rope $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
for tree in base new; do
  if [ $tree = base ]; then (cd .carry/base && PYTHONPATH=$PWD timeout 80 python3 benchmarks/bench_engine.py $F --step-trace $OUT/trace_${tree}1.jsonl 2>>$OUT/err.txt); else timeout 80 python3 benchmarks/bench_engine.py $F --step-trace $OUT/trace_${tree}1.jsonl 2>>$OUT/err.txt; fi | grep '"concurrency"' | sed "s/^{/{\"tree\": \"$tree\", /" >> $OUT/bench.jsonl; t bench_$tree $?
done
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/models/voxcpm/test_model_gpu.py tests/engine/models/voxcpm/test_parity_gpu.py >> $OUT/gpu_tests.txt 2>&1; t gpu_model_tests $?
grep -E 'passed|failed|FAILED|Error' $OUT/gpu_tests.txt | tail -12
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for l in open(out + "/rope_sweep.jsonl"):
    d = json.loads(l)
    if "ms" in d: print("sweep", d.get("path"), d.get("warps"), d.get("heads_per_program"), d.get("max_registers"), d["ms"])
for l in open(out + "/rope.jsonl"):
    d = json.loads(l)
    if "ms" in d: print("rope", d["tree"], d["batch"], d["keep"], d["path"], d["ms"], d.get("tb_s"))
for l in open(out + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate")}))
for name in sorted(os.listdir(out)):
    if name.startswith("trace_"):
        steps = [json.loads(l) for l in open(os.path.join(out, name))]
        big = [s for s in steps if s["batch"] >= 1000]
        print(name, "admits", [(s["batch"], s["admitted"], s["ms"]) for s in steps if s["admitted"]][-4:],
              "median full step", sorted(s["ms"] for s in big)[len(big) // 2] if big else None)
PY
tail -3 $OUT/err.txt
