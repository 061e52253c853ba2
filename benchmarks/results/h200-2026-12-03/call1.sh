# Session 22, call 1: the gate/up GPU test at its new bounds and the FP8 tests on the GPU; step_timeline at B=1,024
# (FP8 LocDiT); bench_engine c=1,024 with the backbone's FP8 from 2,048 / 4,096 / 8,192 rows per call against none,
# interleaved (burst splits vary from run to run), and c=1 with the chosen one.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py tests/engine/models/voxcpm/test_fp8.py -k "gate_up or fp8" > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
timeout 120 python3 benchmarks/step_timeline.py --model /tmp/c2 --batch 1024 --fp8-gemms on >> $OUT/timeline.jsonl 2>>$OUT/err.txt; t timeline $?
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on"
for rows in 0 8192 4096 0 8192 2048; do
  if [ $rows = 0 ]; then B="--fp8-backbone off"; else B="--fp8-backbone on --fp8-backbone-min-rows $rows"; fi
  timeout 90 python3 benchmarks/bench_engine.py $F $B --concurrency 1024 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t "bench$rows" $?
done
timeout 60 python3 benchmarks/bench_engine.py $F --fp8-backbone on --fp8-backbone-min-rows 8192 --concurrency 1 1 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t c1 $?
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -8
cut -c1-600 $OUT/timeline.jsonl
python3 -c "
import json, os
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('concurrency', 'fp8_backbone', 'fp8_backbone_min_rows', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_p90', 'xrt_aggregate')}))
"
tail -3 $OUT/err.txt
