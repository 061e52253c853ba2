# Session 19, call 3: the alignment hint in the tiny-row attention kernels too (q, k, v strides). GPU kernel tests;
# rope_attention_bench --sweep at B=1,024 (the best FP8 launch of the whole group written into
# ROPE_ATTENTION_LARGE_GRID here); the engine's launch base (.carry/base) and new at B=512, 1,024; bench_engine FP8
# c=1,024 base and new, and new with --fp8-backbone; profile_step at B=1,024; the model's GPU and parity tests.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "snake or conv or residual or rope or attention" > $OUT/gpu_tests.txt 2>&1; t gpu_kernel_tests $?
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
timeout 160 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F > $OUT/bench.jsonl 2>>$OUT/err.txt; t bench $?
timeout 75 python3 benchmarks/bench_engine.py $F --fp8-backbone on 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new fp8_backbone", /' >> $OUT/bench.jsonl; t bench_fp8_backbone $?
timeout 130 python3 benchmarks/profile_step.py --model /tmp/c2 --batch 1024 --steps 4 --fp8-gemms on --top 40 > $OUT/profile.jsonl 2>>$OUT/err.txt; t profile $?
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
    if "fused" in d.get("path", ""): print("rope", d["tree"], d["batch"], d["keep"], d["path"], d["ms"], d["tb_s"])
for l in open(out + "/bench.jsonl"):
    if '"concurrency"' in l:
        d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate")}))
for l in open(out + "/profile.jsonl"):
    d = json.loads(l)
    if "kernels_eager" in d:
        k = d["kernels_eager"]; top = k.pop("top_ms"); d.pop("kernels_admit", None); d.pop("kernels_eager")
        print(json.dumps(d)); print(json.dumps(k)); print(json.dumps(dict(list(top.items())[:30])))
PY
tail -3 $OUT/err.txt
