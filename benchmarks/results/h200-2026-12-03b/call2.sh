# Session 23, call 2: the pinned-buffer GPU test at three buffers alive; bench_engine c=1,024 (FP8 LocDiT, the
# backbone's FP8 from 8,192 rows, settled) with three pinned result buffers cached per bucket, the engine's burst
# window (1/20 ms) against the server's (5/150 ms), interleaved, with step traces; c=1 TTFB.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_cuda_graphs.py -k "pinned" > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192"
for w in 5_150 1_20 5_150 1_20; do
  timeout 90 python3 benchmarks/bench_engine.py $F --coalesce-ms ${w%_*} --coalesce-max-ms ${w#*_} --concurrency 1024 --step-trace $OUT/trace_$w.jsonl 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t "bench_$w" $?
done
timeout 60 python3 benchmarks/bench_engine.py $F --concurrency 1 1 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t c1 $?
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -4
python3 -c "
import json, os
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('concurrency', 'settle', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_mean', 'rtf_p90', 'xrt_aggregate', 'gap_max_ms')}))
"
tail -3 $OUT/err.txt
