# Session 15, call 4: compare_anchor.sh for VoxCPM2 (ours bf16 against nano-vllm-voxcpm, c = 1 8 64 256 512), ours with
# FP8 at c = 1, 512, 1024 on the same checkpoint, then few_rows_configs.py (weights from memory).
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
[ -f /tmp/c2/config.json ] && ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2
BENCH_ARGS="--max-num-seqs 512" timeout 400 bash benchmarks/compare_anchor.sh voxcpm2 .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>$OUT/err.txt; t compare $?
timeout 110 python3 benchmarks/bench_engine.py --model /tmp/ckpt-voxcpm2 --steps 60 --concurrency 1 512 1024 --max-num-seqs 1024 --fp8-gemms on 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/bench_fp8.jsonl; t fp8 $?
timeout 60 python3 benchmarks/few_rows_configs.py > $OUT/few_rows_configs.jsonl 2>>$OUT/err.txt; t configs $?
cat $OUT/compare-voxcpm2/ratios.md
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/bench_fp8.jsonl"):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ("concurrency", "ttfb_p50_ms", "rtf_p90", "xrt_aggregate")}))
PY
tail -2 $OUT/err.txt
