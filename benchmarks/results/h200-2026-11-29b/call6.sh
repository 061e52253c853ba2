# Session 14, call 6: Qwen3-TTS's projections and LM heads through the few-rows kernels (working tree) against
# HEAD (base): its graph tests at tiny and full size, then bench_engine c=1 (60 frames) alternating, two pairs.
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
Q=/tmp/q06
(python3 -m engine.models.qwen3tts.make_checkpoint --variant customvoice-0.6b --size full --out $Q >/dev/null 2>>$OUT/err.txt) &
timeout 90 python3 -m pytest -q -m gpu tests/engine/models/qwen3tts/test_graphs.py -p no:cacheprovider 2>&1 | grep -v "^$" | tail -4 > $OUT/gpu_tests.txt; t gpu_tests $?
tail -2 $OUT/gpu_tests.txt
wait; t ckpt 0
for r in 1 2; do
  B="benchmarks/bench_engine.py --model $Q --steps 60 --concurrency 1"
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 35 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /' >> $OUT/bench_ab.jsonl); t base_$r $?
  timeout 35 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t new_$r $?
done
python3 -c "
import json,os
for l in open(os.environ['OUT']+'/bench_ab.jsonl'):
    d=json.loads(l); print(json.dumps({k:d.get(k) for k in ('tree','concurrency','ttfb_p50_ms','rtf_p90','xrt_aggregate')}))"
tail -3 $OUT/err.txt
