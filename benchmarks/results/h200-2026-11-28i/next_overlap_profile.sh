# Not run yet (~120 s): does a step's VAE hide under the next step's solver? profile_step.py at B=512 with its
# cfm_vae_overlapped key (the CFM and VAE graphs launched together on two streams) against cfm + vae.
#   scripts/prepare_device_carry.sh; cp benchmarks/results/h200-2026-11-28i/next_overlap_profile.sh .carry/;
#   then bash .carry/next_overlap_profile.sh with carry [".carry"].
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 300 python3 benchmarks/profile_step.py --model $C --batch 256 512 --fp8-gemms on 2>>$OUT/err.txt | grep '^{' > $OUT/profile.jsonl; t profile $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/profile.jsonl"):
    d = json.loads(l)
    print(json.dumps({k: d.get(k) for k in ("batch", "step_graph", "cfm", "vae", "cfm_vae_overlapped", "engine_step")} | {"hidden_ms": round(d["cfm"] + d["vae"] - d["cfm_vae_overlapped"], 2)}))
PY
