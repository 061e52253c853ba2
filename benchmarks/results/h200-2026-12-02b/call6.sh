# Session 20, call 6: a burst window cut by its cap leads the rest (engine_loop). bench_engine FP8 c=1,024 twice with
# step traces: how each burst went in.
source scripts/device_env.sh > $OUT/gpu.txt
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
for run in 1 2; do
  timeout 75 python3 benchmarks/bench_engine.py $F --step-trace $OUT/trace_$run.jsonl 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl
done
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for l in open(out + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("concurrency", "ttfb_p50_ms", "ttfb_p90_ms", "rtf_p90", "xrt_aggregate")}))
for run in (1, 2):
    steps = [json.loads(l) for l in open(f"{out}/trace_{run}.jsonl")]
    print(run, "admits", [(s["batch"], s["admitted"], s["ms"]) for s in steps if s["admitted"]][-5:])
    os.remove(f"{out}/trace_{run}.jsonl")
PY
tail -2 $OUT/err.txt
