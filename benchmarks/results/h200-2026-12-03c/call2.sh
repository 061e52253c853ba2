# Session 24, call 2: the step loop's host path between two steps (chunks made while the next step runs, the
# scheduler's running/paused counts kept instead of summed, Sequence.num_prompt a field) against main (487d233),
# bench_engine c=1,024 interleaved base, new, base, new (ab_trees.py), with step traces; the GPU's clocks and power
# sampled every 50 ms through the second round (smi.csv); c=1 TTFB on the new tree.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/engine/test_engine_core.py > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2; do
  [ $r = 2 ] && { nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 50 > $OUT/smi.csv 2>>$OUT/err.txt & SMI=$!; }
  timeout 220 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_r$r.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"r":'$r', /' >> $OUT/bench.jsonl; t ab$r $?
done
kill $SMI
timeout 60 python3 benchmarks/bench_engine.py $F --concurrency 1 1 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench_c1.jsonl; t c1 $?
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -4
python3 - <<'PY'
import json, os, statistics
out = os.environ['OUT']
for name in ('bench.jsonl', 'bench_c1.jsonl'):
    for l in open(f'{out}/{name}'):
        d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('r', 'tree', 'concurrency', 'ttfb_p50_ms', 'rtf_mean', 'rtf_p90', 'xrt_aggregate', 'gap_max_ms')}))
for r in (1, 2):
    rows = [json.loads(l) for l in open(f'{out}/trace_r{r}.jsonl')]
    starts = [i for i, x in enumerate(rows) if x['admitted'] >= 1000]
    for n, s in enumerate(starts):
        burst = [x for x in rows[s:s + 60] if x['batch'] >= 1000]
        period = [round(1e3 * (b['t'] - a['t']), 2) for a, b in zip(burst, burst[1:])]
        print(json.dumps({'r': r, 'run': n, 'admission_ms': burst[0]['ms'], 'arrival_ms': round(1e3 * (burst[0]['arrival'][1] - burst[0]['arrival'][0]), 1),
                          'step_ms_median': statistics.median(x['ms'] for x in burst[1:]), 'period_ms_median': statistics.median(period[1:]),
                          'between_ms_median': round(statistics.median(1e3 * (b['t'] - a['t']) - a['ms'] for a, b in zip(burst[1:], burst[2:])), 3),
                          'first_periods': period[:5]}))
PY
awk -F', ' '{print $2, $6}' $OUT/smi.csv | sort | uniq -c | sort -rn | head -12
tail -3 $OUT/err.txt
