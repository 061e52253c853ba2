# Session 23, call 1: the fused attention's GPU test with rows a program; its rows sweep at B=1,024 (FP8 rows, 11
# positions); bench_engine c=1,024 (FP8 LocDiT, the backbone's FP8 from 8,192 rows) with the process settled as the
# server's engine process is (new default) against Python's defaults (--settle off), interleaved, with step traces.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "rope_attention" > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
timeout 200 python3 benchmarks/rope_attention_bench.py --batch 1024 --keep 11 --sweep rows > $OUT/attention.jsonl 2>>$OUT/err.txt; t sweep $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192"
for s in off on off on; do
  timeout 90 python3 benchmarks/bench_engine.py $F --settle $s --concurrency 1024 --step-trace $OUT/trace_$s.jsonl 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t "bench_settle_$s" $?
done
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -8
python3 -c "
import json, os
rows = [json.loads(l) for l in open(os.environ['OUT'] + '/attention.jsonl')]
for d in sorted([r for r in rows if 'ms' in r], key=lambda r: r['ms'])[:12]: print(json.dumps(d))
for d in rows:
    if d.get('rows_per_program') == 1 and d.get('stages') == 1 and d.get('max_registers') == 96: print('engine-like', json.dumps(d))
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('concurrency', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_mean', 'rtf_p90', 'xrt_aggregate', 'gap_max_ms')}))
"
tail -3 $OUT/err.txt
