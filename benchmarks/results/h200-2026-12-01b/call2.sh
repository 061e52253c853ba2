# Session 18, call 2 (main at 3b05ffd): compare_anchor.sh for VoxCPM2 (ours bf16 against nano-vllm-voxcpm 2.0.5,
# c = 1 8 64 256 512, --max-num-seqs 512); ours FP8 at c = 1,024 with and without --fp8-backbone; profile_step at
# B=1,024 (FP8) with the top kernels of an eager step.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/ckpt-voxcpm2 >/dev/null 2>>/tmp/err.txt; t ckpt $?
BENCH_ARGS="--max-num-seqs 512" timeout 250 bash benchmarks/compare_anchor.sh voxcpm2 .carry/anchor 60 "1 8 64 256 512" > /dev/null 2>>/tmp/err.txt; t compare $?
rm -f $OUT/compare-voxcpm2/gpu.txt
F="--model /tmp/ckpt-voxcpm2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
timeout 75 python3 benchmarks/bench_engine.py $F 2>>/tmp/err.txt | grep '"concurrency"' | sed 's/^{/{"fp8_backbone": "off", /' >> $OUT/fp8.jsonl; t fp8 $?
timeout 75 python3 benchmarks/bench_engine.py $F --fp8-backbone on 2>>/tmp/err.txt | grep '"concurrency"' | sed 's/^{/{"fp8_backbone": "on", /' >> $OUT/fp8.jsonl; t fp8_backbone $?
timeout 150 python3 benchmarks/profile_step.py --model /tmp/ckpt-voxcpm2 --batch 1024 --steps 4 --fp8-gemms on --top 40 > $OUT/profile.jsonl 2>>/tmp/err.txt; t profile $?
cat $OUT/compare-voxcpm2/ratios.md
python3 -c "
import json
for l in open('$OUT/fp8.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('fp8_backbone', 'concurrency', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_p90', 'xrt_aggregate')}))
for l in open('$OUT/profile.jsonl'):
    d = json.loads(l)
    if 'kernels_eager' in d:
        k = d['kernels_eager']; top = k.pop('top_ms'); d.pop('kernels_admit', None); d.pop('kernels_eager')
        print(json.dumps(d)); print(json.dumps(k)); print(json.dumps(dict(list(top.items())[:25])))
"
tail -3 /tmp/err.txt
