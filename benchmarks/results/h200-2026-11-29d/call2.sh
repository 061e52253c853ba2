# Session 16, call 2: deferred hand-over (working tree) against fc45f11 (.carry/base), bench_engine FP8 c=1 and 1,024,
# alternating twice, step traces; then the new tree with a one-step admission of the burst and with 26-position prompts.
source scripts/device_env.sh >/dev/null
ROOT=$PWD
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
[ -f /tmp/c2/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
B="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on"
tag() { python3 -c "import json,sys
for l in sys.stdin:
    if '\"concurrency\"' in l: d=json.loads(l); d['tree']='$1'; d['run']='$2'; print(json.dumps(d), flush=True)"; }
for i in 1 2; do
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 120 python3 benchmarks/bench_engine.py $B --concurrency 1 1024 --step-trace $OUT/trace_base$i.jsonl 2>>$OUT/err.txt) | tag base ab$i >> $OUT/bench.jsonl; t base$i $?
  timeout 120 python3 benchmarks/bench_engine.py $B --concurrency 1 1024 --step-trace $OUT/trace_new$i.jsonl 2>>$OUT/err.txt | tag new ab$i >> $OUT/bench.jsonl; t new$i $?
done
timeout 120 python3 benchmarks/bench_engine.py $B --concurrency 1024 --idle-prefill-tokens 98304 --step-trace $OUT/trace_one_admission.jsonl 2>>$OUT/err.txt | tag new one_admission >> $OUT/bench.jsonl; t one $?
SHORT="hello world and the speech model is to stream audio and voice test the model is to stream the voice and the audio test world hello"
timeout 120 python3 benchmarks/bench_engine.py $B --concurrency 1024 --text "$SHORT" --step-trace $OUT/trace_short.jsonl 2>>$OUT/err.txt | tag new short26 >> $OUT/bench.jsonl; t short $?
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for l in open(out + "/bench.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("tree", "run", "concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
for name in sorted(os.listdir(out)):
    if name.startswith("trace"):
        steps = [json.loads(l) for l in open(f"{out}/{name}")]
        full = [s["ms"] for s in steps if s["batch"] == 1024 and not s["admitted"]]
        adm = [s for s in steps if s["admitted"] and s["batch"] > 8]
        print(name, "B1024 steps", len(full), "median", statistics.median(full) if full else None, "admission steps", len(adm), "admission ms", round(sum(s["ms"] for s in adm), 1))
PY
tail -3 $OUT/err.txt
