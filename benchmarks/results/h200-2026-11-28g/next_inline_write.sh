# The measurement of the step loop's own writes (007f718); run as the eleventh session's call 2 (../h200-2026-11-28h). One call (~400 s):
#   scripts/prepare_device_carry.sh; python benchmarks/ab_trees.py prepare --ref 0064eda --out .carry/base;
#   cp benchmarks/results/h200-2026-11-28g/hop.patch.txt .carry/hop.patch (for this tree);
#   cp benchmarks/results/h200-2026-11-28f/hop.patch.txt .carry/hop_base.patch (for 0064eda's engine/process.py);
#   cp benchmarks/results/h200-2026-11-28f/hops_one_session.py.txt .carry/hops_one_session.py;
#   then bash .carry/next_inline_write.sh with carry [".carry"].
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
# The throughput side first, without the hop patch: 512-session levels in both trees.
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --client-processes 4 --client-cpus 12-15"
timeout 200 python3 benchmarks/ab_trees.py run --base .carry/base -- $WS --sessions 512 1 1 1 --format opus \
  --sample-rate 48000 "--server-args=--fp8-gemms on" 2>$OUT/err_ab.txt | grep '^{' > $OUT/ws_ab.jsonl; t ab $?
# Then one session hop by hop in both trees.
patch -p1 < .carry/hop.patch > /dev/null; t patch_new $?
patch -p1 -F3 -d .carry/base < .carry/hop_base.patch > /dev/null; t patch_base $?
ROOT=$PWD; mkdir -p hop_base hop_new
WS1="benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 1 1 1 1 1 1 1 --format opus --sample-rate 48000 --client-processes 1 --server-args=--fp8-gemms=on"
(cd .carry/base && HOP_TRACE_DIR=$ROOT/hop_base PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 110 python3 $WS1 2>$OUT/err_base.txt | grep '^{' > $OUT/ws1_base.jsonl); t ws1_base $?
HOP_TRACE_DIR=$ROOT/hop_new PYTHONPATH=$ROOT:$PYTHONPATH timeout 110 python3 $WS1 2>$OUT/err_new.txt | grep '^{' > $OUT/ws1_new.jsonl; t ws1_new $?
for tree in base new; do echo "== $tree"; python3 .carry/hops_one_session.py hop_$tree; done | tee $OUT/hops.txt
python3 - <<'PY'
import json, os
for f in ("ws_ab", "ws1_base", "ws1_new"):
    for l in open(os.environ["OUT"] + f"/{f}.jsonl"):
        d = json.loads(l)
        if "sessions" in d:
            print(f, d.get("tree"), d["sessions"], d["starved_sessions"], d["first_text_to_first_frame_ms"]["p50"], d.get("xrt"))
PY
