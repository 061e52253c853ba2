source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
patch -p1 -F3 < .carry/hop.patch > /dev/null; t patch_new $?
patch -p1 -F3 -d .carry/base < .carry/hop.patch > /dev/null; t patch_base $?
ROOT=$PWD; mkdir -p hop_base hop_new
WS="benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 1 1 1 1 1 1 1 --format opus --sample-rate 48000 --client-processes 1 --server-args=--fp8-gemms=on"
(cd .carry/base && HOP_TRACE_DIR=$ROOT/hop_base PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 110 python3 $WS 2>$OUT/err_base.txt | grep '^{' > $OUT/ws_base.jsonl); t ws_base $?
HOP_TRACE_DIR=$ROOT/hop_new PYTHONPATH=$ROOT:$PYTHONPATH timeout 110 python3 $WS 2>$OUT/err_new.txt | grep '^{' > $OUT/ws_new.jsonl; t ws_new $?
tar czf $OUT/hops.tgz hop_base hop_new
for tree in base new; do echo "== $tree"; python3 .carry/hops_one_session.py hop_$tree | tee $OUT/hops_$tree.txt; done
python3 - <<'PY'
import json, os
for f in ("ws_base", "ws_new"):
    for l in open(os.environ["OUT"] + f"/{f}.jsonl"):
        d = json.loads(l)
        if "sessions" in d:
            print(f, d["workers"], d["first_text_to_first_frame_ms"]["p50"], d.get("xrt"))
PY
tail -3 $OUT/err_new.txt
