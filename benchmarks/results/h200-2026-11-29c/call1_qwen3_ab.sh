# Not run yet (~330 s): call 6 again with room for a Qwen3-TTS engine's start (its bench runs hit a 35 s timeout).
# Qwen3-TTS's projections and LM heads through the few-rows kernels (qwen3_few_rows.patch.txt applied to the working
# tree) against HEAD (base): bench_engine c=1 (60 frames) alternating, three pairs, then profile_qwen3 at B=1 on both.
#   git apply benchmarks/results/h200-2026-11-29b/qwen3_few_rows.patch.txt; scripts/prepare_device_carry.sh;
#   python benchmarks/ab_trees.py prepare --ref HEAD --out .carry/base;
#   cp benchmarks/results/h200-2026-11-29b/next_qwen3_ab.sh .carry/; then bash .carry/next_qwen3_ab.sh with carry [".carry"].
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
Q=/tmp/q06
[ -f $Q/config.json ] || python3 -m engine.models.qwen3tts.make_checkpoint --variant customvoice-0.6b --size full --out $Q >/dev/null 2>>$OUT/err.txt; t ckpt $?
for r in 1 2 3; do
  B="benchmarks/bench_engine.py --model $Q --steps 60 --concurrency 1"
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 90 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /' >> $OUT/bench_ab.jsonl); t base_$r $?
  timeout 90 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t new_$r $?
done
timeout 200 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/profile_qwen3.py --model $Q --batch 1 2>>$OUT/err.txt | grep '"batch"' > $OUT/profile_b1.jsonl; t profile $?
python3 -c "
import json,os
for l in open(os.environ['OUT']+'/bench_ab.jsonl'):
    d=json.loads(l); print(json.dumps({k:d.get(k) for k in ('tree','concurrency','ttfb_p50_ms','rtf_p90','xrt_aggregate')}))"
tail -3 $OUT/err.txt
