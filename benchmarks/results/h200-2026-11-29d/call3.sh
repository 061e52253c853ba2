# Session 16, call 3: HEAD (deferred hand-over, idle budget 96 per slot) alone: bench_engine FP8 c = 1, 512, 1,024 with
# a step trace; then compare_anchor.sh for VoxCPM2 (bf16, c = 1 8 64 256 512, --max-num-seqs 512).
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
[ -f /tmp/c2/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2
timeout 150 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1 512 1024 --step-trace $OUT/trace_fp8.jsonl 2>>$OUT/err.txt | grep '"concurrency"\|"engine"' > $OUT/bench_fp8.jsonl; t fp8 $?
BENCH_ARGS="--max-num-seqs 512" timeout 400 bash benchmarks/compare_anchor.sh voxcpm2 .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>$OUT/err.txt; t compare $?
cat $OUT/compare-voxcpm2/ratios.md
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for l in open(out + "/bench_fp8.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate", "idle_prefill_tokens", "prompt_positions")}))
PY
tail -2 $OUT/err.txt
