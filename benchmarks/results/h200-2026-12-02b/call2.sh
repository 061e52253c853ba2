# Session 20, call 2: ROPE_ATTENTION_LARGE_GRID = (4 warps, 4 heads a program, 96 registers) on top of call 1's half
# table rows. GPU kernel tests (rope, attention, quantising); the engine's launch at B=512, 1,024 (keep 11 and 4);
# profile_step at B=1,024 (FP8); bench_engine FP8 c=1,024 twice and once with --fp8-backbone (step traces); the
# model's GPU and parity tests.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "rope or attention or fp8" > $OUT/gpu_tests.txt 2>&1; t gpu_kernel_tests $?
timeout 60 python3 benchmarks/rope_attention_bench.py --batch 512 1024 > $OUT/rope.jsonl 2>>$OUT/err.txt; t rope $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
timeout 130 python3 benchmarks/profile_step.py --model /tmp/c2 --batch 1024 --steps 4 --fp8-gemms on --top 40 > $OUT/profile.jsonl 2>>$OUT/err.txt; t profile $?
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
for run in 1 2 3; do
  extra=""; [ $run = 3 ] && extra="--fp8-backbone on"
  timeout 80 python3 benchmarks/bench_engine.py $F $extra --step-trace $OUT/trace_$run.jsonl 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t bench_$run $?
done
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/models/voxcpm/test_model_gpu.py tests/engine/models/voxcpm/test_parity_gpu.py >> $OUT/gpu_tests.txt 2>&1; t gpu_model_tests $?
grep -E 'passed|failed|FAILED|Error' $OUT/gpu_tests.txt | tail -12
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for l in open(out + "/rope.jsonl"):
    d = json.loads(l)
    if "ms" in d: print("rope", d["batch"], d["keep"], d["path"], d["ms"], d.get("tb_s"))
for l in open(out + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("concurrency", "fp8_backbone", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate")}))
for run in (1, 2, 3):
    steps = [json.loads(l) for l in open(f"{out}/trace_{run}.jsonl")]
    big = [s for s in steps if s["batch"] >= 1000 and not s["admitted"]]
    print(run, "admits", [(s["batch"], s["admitted"], s["ms"]) for s in steps if s["admitted"]][-4:],
          "median full step", sorted(s["ms"] for s in big)[len(big) // 2] if big else None)
for l in open(out + "/profile.jsonl"):
    d = json.loads(l)
    if "kernels_eager" in d:
        k = d["kernels_eager"]; top = k.pop("top_ms"); d.pop("kernels_admit", None); d.pop("kernels_eager")
        print(json.dumps(d)); print(json.dumps(k)); print(json.dumps(dict(list(top.items())[:16])))
PY
tail -3 $OUT/err.txt
