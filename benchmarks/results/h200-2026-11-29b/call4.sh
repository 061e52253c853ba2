# Session 14, call 4 (working tree: the few-rows GEMM kernels): the one-stream solver test again (its count fixed),
# then issue 12's single session: one process (--workers 0) against the tree, three alternating rounds of eight
# 1-session Opus levels, clients on CPUs 12-15 (the thirteenth session's call 1, on this tree).
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt) &
timeout 100 python3 -m pytest -q -m gpu -s tests/engine/models/voxcpm/test_model_gpu.py -k few_rows -p no:cacheprovider 2>&1 | grep "few-rows kernels vs\|passed\|failed\|Error" > $OUT/model_test.txt; t model_test $?
cat $OUT/model_test.txt
wait; t ckpt 0
WS1="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 1 1 1 1 1 1 1 --format opus --sample-rate 48000 --client-processes 1 --client-cpus 12-15 --server-args=--fp8-gemms=on"
for round in 1 2 3; do
  timeout 70 $WS1 --workers 0 2>>$OUT/err.txt | grep '^{' >> $OUT/one_process.jsonl; t one_process_$round $?
  timeout 70 $WS1 2>>$OUT/err.txt | grep '^{' >> $OUT/tree.jsonl; t tree_$round $?
done
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for layout in ("one_process", "tree"):
    ff = [json.loads(l)["first_text_to_first_frame_ms"]["p50"] for l in open(f"{out}/{layout}.jsonl") if '"sessions"' in l]
    print(json.dumps({"layout": layout, "levels": len(ff), "first_frame_ms": ff, "median": statistics.median(ff) if ff else None}))
PY
tail -3 $OUT/err.txt
