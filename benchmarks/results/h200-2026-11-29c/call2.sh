# Session 15, call 2: issue 12's single session with the coordinator's spare slots. Three layouts, three alternating
# rounds of eight 1-session Opus levels each, clients on CPUs 12-15: the server in one process (--workers 0), the tree
# before the spares (ce5cf0c, .carry/base), the tree with them (HEAD).
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
WS1="benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 1 1 1 1 1 1 1 --format opus --sample-rate 48000 --client-processes 1 --client-cpus 12-15 --server-args=--fp8-gemms=on"
for round in 1 2 3; do
  timeout 70 python3 $WS1 --workers 0 2>>$OUT/err.txt | grep '^{' >> $OUT/ws1_one_process.jsonl; t one_process_$round $?
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 70 python3 $WS1 2>>$OUT/err.txt | grep '^{' >> $OUT/ws1_tree_base.jsonl); t tree_base_$round $?
  timeout 70 python3 $WS1 2>>$OUT/err.txt | grep '^{' >> $OUT/ws1_tree_spares.jsonl; t tree_spares_$round $?
done
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for layout in ("one_process", "tree_base", "tree_spares"):
    ff = [json.loads(l)["first_text_to_first_frame_ms"]["p50"] for l in open(f"{out}/ws1_{layout}.jsonl") if '"sessions"' in l]
    print(json.dumps({"layout": layout, "levels": len(ff), "first_frame_ms": ff, "median": statistics.median(ff) if ff else None}))
PY
tail -3 $OUT/err.txt
