# Session 23, call 3: the host allocator's stat names on this torch and the pinned-buffer GPU test; bench_engine
# c=1,024 (FP8 LocDiT, the backbone's FP8 from 8,192 rows, settled, the server's 5/150 ms burst window) with three
# pinned result buffers cached per bucket (the engine's) against four (pinned_probe.py), interleaved, with step
# traces and the pinned blocks the allocator created.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
python3 -c "import torch; x = torch.empty(4, pin_memory=True); print(torch.__version__, sorted(torch.cuda.host_memory_stats()))" > $OUT/host_stats_keys.txt 2>&1
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_cuda_graphs.py -k "pinned" > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for n in 4 3 4 3; do
  timeout 90 python3 benchmarks/results/h200-2026-12-03b/pinned_probe.py $n $F --concurrency 1024 --step-trace $OUT/trace_$n.jsonl 2>>$OUT/err.txt | grep -e '"concurrency"' -e '"pinned_alive"' >> $OUT/bench.jsonl; t "bench_$n" $?
done
cut -c1-400 $OUT/host_stats_keys.txt
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -4
python3 -c "
import json, os
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('concurrency', 'ttfb_p50_ms', 'rtf_mean', 'rtf_p90', 'xrt_aggregate', 'gap_max_ms')} if 'concurrency' in d else d))
"
tail -3 $OUT/err.txt
