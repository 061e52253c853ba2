# Session 22, call 3: the whole GPU test suite on the session's tree; then bench_engine c=1,024 (FP8 LocDiT), the
# backbone in bf16 against FP8 from 8,192 rows, interleaved, as long as the call lasts.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
for rows in 0 8192 0 8192 0 8192; do
  [ $(( $(date +%s)-T0 )) -gt 470 ] && break
  if [ $rows = 0 ]; then B="--fp8-backbone off"; else B="--fp8-backbone on --fp8-backbone-min-rows $rows"; fi
  timeout 60 python3 benchmarks/bench_engine.py $F $B 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t "bench$rows" $?
done
tail -15 $OUT/gpu_tests.txt | grep -E "passed|failed|FAIL|Error" | cut -c1-200
python3 -c "
import json, os
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('fp8_backbone_min_rows', 'fp8_backbone', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_p90', 'xrt_aggregate')}))
"
