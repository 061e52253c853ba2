# Call 1 (HEAD 86f50fb): the twelfth session's two ready scripts in one call.
#  a) profile_step.py at B=256 and 512 (FP8 GEMMs on) with cfm_vae_overlapped: hidden_ms = cfm + vae - overlapped.
#  b) issue 12's single session: one process (--workers 0) against the tree, three alternating rounds of eight
#     1-session Opus levels, clients on CPUs 12-15.
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 200 python3 benchmarks/profile_step.py --model $C --batch 256 512 --fp8-gemms on 2>>$OUT/err.txt | grep '^{' > $OUT/profile.jsonl; t profile $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/profile.jsonl"):
    d = json.loads(l)
    print(json.dumps({k: d.get(k) for k in ("batch", "step_graph", "cfm", "vae", "cfm_vae_overlapped", "engine_step")} | {"hidden_ms": round(d["cfm"] + d["vae"] - d["cfm_vae_overlapped"], 2)}))
PY
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
