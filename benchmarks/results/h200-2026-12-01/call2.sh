# Session 17, call 2: kernels.rope_attention rebuilt on _dense_attention_kernel's tiles (one [G*S_P, D] tile a
# program), rotating q and k as it loads them or after rope_qk, and o_proj's bound-scaled e4m3 rows written at once.
# Its GPU test and the FP8 drift test; both launches at B=1,024 (the fastest written into the working tree for the
# engine runs), the engine's launch at B = 512 and 1,024, keep 11 and 4; bench_engine FP8 (new c = 1 and 1,024,
# base c = 1,024, new c = 1,024) with step traces. base = .carry/base (HEAD before the change).
source scripts/device_env.sh > $OUT/gpu.txt
ROOT=$PWD
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "rope_attention" \
  tests/engine/models/voxcpm/test_fp8.py -k "rope_attention or drift" > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
timeout 90 python3 benchmarks/rope_attention_bench.py --batch 1024 --keep 11 --sweep > $OUT/sweep.jsonl 2>>$OUT/err.txt; t sweep $?
python3 - <<'PY' | tee -a $OUT/log.txt
import json, os, re
lines = [json.loads(l) for l in open(os.environ["OUT"] + "/sweep.jsonl") if '"fused_fp8"' in l]
best = min(lines, key=lambda d: d["ms"])
print("best", json.dumps(best))
path = "engine/kernels/triton_ops.py"
s = open(path).read()
s = re.sub(r"^ROPE_ATTENTION_ROTATES = \w+$", f"ROPE_ATTENTION_ROTATES = {best['rotates']}", s, flags=re.M)
s = re.sub(r"^ROPE_ATTENTION_WARPS = \d+$", f"ROPE_ATTENTION_WARPS = {best['warps']}", s, flags=re.M)
open(path, "w").write(s)
PY
grep "^ROPE_ATTENTION" engine/kernels/triton_ops.py | tee -a $OUT/log.txt
timeout 60 python3 benchmarks/rope_attention_bench.py --batch 512 1024 --keep 11 4 > $OUT/engine_launch.jsonl 2>>$OUT/err.txt; t launch $?
[ -f /tmp/c2/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
B="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on"
timeout 110 python3 benchmarks/bench_engine.py $B --concurrency 1 1024 --step-trace $OUT/trace_new1.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench.jsonl; t new1 $?
(cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 100 python3 benchmarks/bench_engine.py $B --concurrency 1024 --step-trace $OUT/trace_base.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /') >> $OUT/bench.jsonl; t base $?
timeout 100 python3 benchmarks/bench_engine.py $B --concurrency 1024 --step-trace $OUT/trace_new2.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench.jsonl; t new2 $?
tail -4 $OUT/gpu_tests.txt
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for name in ("sweep", "engine_launch"):
    for l in open(f"{out}/{name}.jsonl"):
        d = json.loads(l)
        if "path" in d:
            print(name, json.dumps({k: v for k, v in d.items() if k not in ("rows",)}))
for l in open(out + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate")}))
for name in ("trace_new1", "trace_base", "trace_new2"):
    steps = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    full = [s["ms"] for s in steps if s["batch"] == 1024 and not s.get("admitted")]
    adm = [(s["admitted"], s["ms"]) for s in steps if s.get("admitted", 0) > 8]
    print(name, "B=1024 steps", len(full), "median", statistics.median(full) if full else None, "admissions", adm[:4])
PY
rm -f $OUT/trace_new1.jsonl
tail -3 $OUT/err.txt
