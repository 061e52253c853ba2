# Session 24, call 4: the streaming upsampling reading cuDNN's channels-last output (the folded transposed-conv weight
# channels-last; _upsample_finish_kernel), with call 2's host-path changes. GPU tests (the upsampling kernels, the VAE
# and bf16 parity against the reference, the model); channels_last_probe.py (engine_cl: the new path per block);
# bench_engine c=1,024 base (main 487d233) against new, interleaved twice, with step traces; c=1 TTFB.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "conv_transpose" > $OUT/gpu_tests.txt 2>&1; t gpu_kernels $?
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/models/voxcpm/test_parity_gpu.py tests/engine/models/voxcpm/test_model_gpu.py >> $OUT/gpu_tests.txt 2>&1; t gpu_parity $?
timeout 100 python3 benchmarks/results/h200-2026-12-03c/channels_last_probe.py > $OUT/probe.jsonl 2>>$OUT/err.txt; t probe $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2; do
  timeout 220 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_r$r.jsonl 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"r":'$r', /' >> $OUT/bench.jsonl; t ab$r $?
done
timeout 60 python3 benchmarks/bench_engine.py $F --concurrency 1 1 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench_c1.jsonl; t c1 $?
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -6
python3 - <<'PY'
import json, os, statistics
out = os.environ['OUT']
for l in open(f'{out}/probe.jsonl'):
    d = json.loads(l); print(json.dumps({k: v for k, v in d.items() if k.endswith('ms') or k in ('block', 'gpu')}))
    if 'engine_cl_kernels' in d: print('   engine_cl', d['engine_cl_kernels'])
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
                          'period_ms_median': statistics.median(period[1:]), 'first_periods': period[:5]}))
PY
tail -3 $OUT/err.txt
