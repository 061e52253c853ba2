# Not run yet: issue 12's single-session item on HEAD, in one call (~300 s): the server in one process (--workers 0)
# against the process tree, three alternating rounds of eight 1-session Opus levels each, clients on CPUs 12-15.
#   scripts/prepare_device_carry.sh; cp benchmarks/results/h200-2026-11-28i/next_one_session_ab.sh .carry/;
#   then bash .carry/next_one_session_ab.sh with carry [".carry"].
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
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
