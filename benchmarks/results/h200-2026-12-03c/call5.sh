# Session 24, call 5: the upsampling's finish pass loading [frames x channels] tiles and storing them transposed
# (call 4's [channels x frames] tiles made blocks 2-5 slower). The upsampling's GPU tests; channels_last_probe.py;
# only if the new path (engine_cl) sums below the old (engine) over the six blocks: one base/new bench round.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "conv_transpose" > $OUT/gpu_tests.txt 2>&1; t gpu_kernels $?
timeout 100 python3 benchmarks/results/h200-2026-12-03c/channels_last_probe.py > $OUT/probe.jsonl 2>>$OUT/err.txt; t probe $?
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -4
WIN=$(python3 -c "
import json, os
rows = [json.loads(l) for l in open(os.environ['OUT'] + '/probe.jsonl')][1:]
for d in rows: print(json.dumps({k: v for k, v in d.items() if k.endswith('ms') or k == 'block'}), file=__import__('sys').stderr)
old, new = sum(d['engine_ms'] for d in rows), sum(d['engine_cl_ms'] for d in rows)
print('yes' if new < old else 'no', round(old, 3), round(new, 3))
")
echo "probe sums: $WIN"
if [ "${WIN%% *}" = yes ]; then
  while [ ! -f /tmp/c2.done ]; do sleep 2; done
  F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
  timeout 220 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t ab $?
  python3 -c "
import json, os
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('tree', 'ttfb_p50_ms', 'rtf_mean', 'rtf_p90', 'xrt_aggregate')}))"
fi
tail -3 $OUT/err.txt
