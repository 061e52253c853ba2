# Session 24, call 1 (main 487d233 plus bump_probe.py): the CUDA-graph GPU tests (the pinned-buffer test as fixed
# last session, not yet run on a GPU); bump_probe.py: EngineCore alone at B=1,024 (no consumers), every step timed
# over two bursts, then the admission and five decode steps profiled.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; touch /tmp/c2.done) &
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_cuda_graphs.py > $OUT/gpu_tests.txt 2>&1; t gpu_tests $?
while [ ! -f /tmp/c2.done ]; do sleep 2; done
timeout 240 python3 benchmarks/results/h200-2026-12-03c/bump_probe.py --model /tmp/c2 > $OUT/bump.jsonl 2>>$OUT/err.txt; t bump $?
grep -E "passed|failed|Error" $OUT/gpu_tests.txt | cut -c1-220 | tail -4
cat $OUT/bump.jsonl | cut -c1-1500
tail -3 $OUT/err.txt
