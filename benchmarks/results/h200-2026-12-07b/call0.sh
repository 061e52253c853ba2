# The 31st session's first call: the working tree (main with prefill ahead in full passes, each one replay of its own
# backbone graph: 8,192 positions over at most 256 rows) against main 254d245 in .carry/base
# (`python benchmarks/ab_trees.py prepare --ref 254d245 --out .carry/base`, carry .carry). GPU tests of the backbone
# graphs (the ahead key's included), then two interleaved pairs of issue 16's c=1,024 run with step traces (each
# round's trace holds base's burst, then the tree's), then c=1 on the tree. ~6 min.
source scripts/device_env.sh > /tmp/gpu.txt; tee $OUT/log.txt < /tmp/gpu.txt
D=benchmarks/results/h100-2026-12-07c
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>/tmp/err.txt; t checkpoint $?
ln -sfn /tmp/c2 /tmp/ckpt-voxcpm2  # compare_anchor.sh's path, for a follow-up call on the warm machine
timeout 150 python3 -m pytest -q -m gpu tests/engine/test_cuda_graphs.py 2>&1 | tail -3 | tee -a $OUT/log.txt; t gpu_tests $?
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150"
for r in 1 2; do
  timeout 170 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py $F --concurrency 1024 --step-trace $OUT/trace_r$r.jsonl 2>>/tmp/err.txt | grep '"concurrency"' | sed "s/^{/{\"r\": $r, /" | tee -a $OUT/bench.jsonl | cut -c1-200; t ab$r $?
  python3 $D/steps.py $OUT/trace_r$r.jsonl | tee -a $OUT/spans.jsonl | cut -c1-500
  gzip $OUT/trace_r$r.jsonl
done
timeout 60 python3 benchmarks/bench_engine.py --model /tmp/c2 --steps 60 --concurrency 1 1 --warmup 2 2>>/tmp/err.txt | grep '"concurrency"' > $OUT/c1.jsonl; t c1 $?
cut -c1-200 $OUT/c1.jsonl
tail -3 /tmp/err.txt
