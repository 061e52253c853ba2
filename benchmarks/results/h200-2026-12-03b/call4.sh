# Session 23, call 4 (the tree as committed): the CUDA-graph GPU tests (the pinned-buffer one with torch.cuda
# initialised first); bench_engine c=1,024 with this session's configuration (FP8 LocDiT, the backbone's FP8 from
# 8,192 rows, the server's 5/150 ms burst window, settled by default) three times, the last with every garbage
# collection timed (gc_probe.py), with step traces; c=1 TTFB.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_cuda_graphs.py > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for i in 1 2; do
  timeout 90 python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_$i.jsonl 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t "bench_$i" $?
done
timeout 90 python3 benchmarks/results/h200-2026-12-03b/gc_probe.py $F --concurrency 1024 --step-trace $OUT/trace_3.jsonl 2>>$OUT/err.txt | grep -e '"concurrency"' -e '"gc"' >> $OUT/bench.jsonl; t bench_gc $?
timeout 60 python3 benchmarks/bench_engine.py $F --concurrency 1 1 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t c1 $?
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -4
python3 -c "
import json, os
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('concurrency', 'settle', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_mean', 'rtf_p90', 'xrt_aggregate', 'gap_max_ms')} if 'concurrency' in d else d))
rows = [json.loads(l) for l in open(os.environ['OUT'] + '/trace_3.jsonl')]
for i, r in enumerate(rows):
    if r['admitted'] >= 100: print('trace3', [[x['t'], x['ms']] for x in rows[i:i + 6]])
"
tail -3 $OUT/err.txt
