# Session 17, call 4 (HEAD with kernels.rope_attention): compare_anchor.sh for VoxCPM2 (ours bf16 against
# nano-vllm-voxcpm 2.0.5, c = 1 8 64 256 512, --max-num-seqs 512); then ours FP8 at c = 1,024 with --fp8-backbone on.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/ckpt-voxcpm2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
BENCH_ARGS="--max-num-seqs 512" timeout 300 bash benchmarks/compare_anchor.sh voxcpm2 .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>$OUT/err.txt; t compare $?
timeout 80 python3 benchmarks/bench_engine.py --model /tmp/ckpt-voxcpm2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --concurrency 1024 2>>$OUT/err.txt | grep '"concurrency"' > $OUT/fp8_backbone.jsonl; t fp8_backbone $?
cat $OUT/compare-voxcpm2/ratios.md
python3 -c "
import json
for l in open('$OUT/fp8_backbone.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('concurrency', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_p90', 'xrt_aggregate')}))"
tail -2 $OUT/err.txt
