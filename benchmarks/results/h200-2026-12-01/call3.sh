# Session 17, call 3: kernels.rope_attention as landed (one [G*S_P, D] tile a program, q and k rotated as loaded,
# 4 warps). GPU tests (the kernels it replaces and feeds, FP8, the model's GPU tests, bf16 parity with the
# reference); the engine's launch at B = 512 and 1,024, keep 11 and 4, against the three passes (two in bf16);
# bench_engine FP8 at c = 1,024 (base, then new with c = 1), bf16 at c = 512 (base, new; --max-num-seqs 512, as
# compare_anchor.sh runs it), step traces; profile_step at B = 1,024 (FP8). base = .carry/base (HEAD before it).
source scripts/device_env.sh > $OUT/gpu.txt
ROOT=$PWD
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "rope or attention or quantize or fp8" \
  tests/engine/models/voxcpm/test_fp8.py tests/engine/models/voxcpm/test_model_gpu.py tests/engine/models/voxcpm/test_parity_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
timeout 40 python3 benchmarks/rope_attention_bench.py --batch 512 1024 --keep 11 4 > $OUT/kernel.jsonl 2>>$OUT/err.txt; t kernel $?
[ -f /tmp/c2/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on"
H="--model /tmp/c2 --steps 60 --max-num-seqs 512 --concurrency 512"
run() { tree=$1; shift; if [ $tree = base ]; then (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 100 python3 benchmarks/bench_engine.py "$@" 2>>$OUT/err.txt); else timeout 100 python3 benchmarks/bench_engine.py "$@" 2>>$OUT/err.txt; fi | grep '"concurrency"' | sed "s/^{/{\"tree\": \"$tree\", /" >> $OUT/bench.jsonl; }
run base $F --concurrency 1024 --step-trace $OUT/trace_fp8_base.jsonl; t fp8_base $?
run new $F --concurrency 1 1024 --step-trace $OUT/trace_fp8_new.jsonl; t fp8_new $?
run base $H --step-trace $OUT/trace_bf16_base.jsonl; t bf16_base $?
run new $H --step-trace $OUT/trace_bf16_new.jsonl; t bf16_new $?
timeout 80 python3 benchmarks/profile_step.py --model /tmp/c2 --batch 1024 --fp8-gemms on > $OUT/profile.jsonl 2>>$OUT/err.txt; t profile $?
tail -3 $OUT/gpu_tests.txt; grep -E "^FAILED|Error" $OUT/gpu_tests.txt | head -10
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for l in open(f"{out}/kernel.jsonl"):
    d = json.loads(l)
    if "path" in d:
        print(json.dumps({k: v for k, v in d.items() if k != "rows"}))
for l in open(out + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "concurrency", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate")}))
for name, batch in (("trace_fp8_base", 1024), ("trace_fp8_new", 1024), ("trace_bf16_base", 512), ("trace_bf16_new", 512)):
    steps = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    full = [s["ms"] for s in steps if s["batch"] == batch and not s.get("admitted")]
    adm = [(s["admitted"], s["ms"]) for s in steps if s.get("admitted", 0) > 8]
    print(name, f"B={batch} steps", len(full), "median", statistics.median(full) if full else None, "admissions", adm[:4])
for l in open(f"{out}/profile.jsonl"):
    d = json.loads(l); print(json.dumps({k: d[k] for k in ("batch", "admit", "engine_step", "step_graph", "cfm", "vae", "locdit_call", "backbone", "host", "tflops") if k in d}))
PY
rm -f $OUT/trace_fp8_new.jsonl $OUT/trace_bf16_new.jsonl $OUT/trace_bf16_base.jsonl  # 8 files come back
tail -3 $OUT/err.txt
