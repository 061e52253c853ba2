# Session 22, call 2: bench_engine c=1,024 (FP8 LocDiT) with the engine's own burst coalescing (1 / 20 ms) against
# the server's (5 / 150 ms), interleaved, each first run with a step trace (how the burst went in); then the server's
# with the backbone's FP8 from 8,192 rows.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t ckpt $?
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --concurrency 1024"
n=0
for co in "1 20" "5 150" "1 20" "5 150" "5 150 8192"; do
  set -- $co; n=$((n+1)); X=""; [ -n "$3" ] && X="--fp8-backbone on --fp8-backbone-min-rows $3"
  T=""; [ $n -le 2 ] && T="--step-trace $OUT/trace_$1_$2.jsonl"
  timeout 90 python3 benchmarks/bench_engine.py $F --coalesce-ms $1 --coalesce-max-ms $2 $X $T 2>>$OUT/err.txt | grep '"concurrency"' >> $OUT/bench.jsonl; t "bench $co" $?
done
python3 -c "
import json, os, glob
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    d = json.loads(l); print(json.dumps({k: d.get(k) for k in ('coalesce_ms', 'coalesce_max_ms', 'fp8_backbone_min_rows', 'ttfb_p50_ms', 'ttfb_p90_ms', 'rtf_p90', 'xrt_aggregate')}))
for f in sorted(glob.glob(os.environ['OUT'] + '/trace_*.jsonl')):
    lines = [json.loads(l) for l in open(f)]
    big = [l for l in lines if l['admitted']][-12:]
    print(f.split('/')[-1], [(l['batch'], l['admitted'], l['positions'], l['ms']) for l in big])
"
tail -3 $OUT/err.txt
