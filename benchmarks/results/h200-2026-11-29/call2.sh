# Call 2 (HEAD 86f50fb): the heaviest kernels of an eager B=512 decode step (FP8 GEMMs on), for issue 16's next lever.
source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 300 python3 benchmarks/profile_step.py --model $C --batch 512 --fp8-gemms on --top 45 2>>$OUT/err.txt | grep '^{' > $OUT/profile_top.jsonl; t profile $?
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/profile_top.jsonl"):
    d = json.loads(l)
    if "batch" in d:
        print(json.dumps({k: d[k] for k in ("batch", "step_graph", "cfm", "vae", "locdit_call", "backbone")}))
        for name, ms in d["kernels_eager"]["top_ms"].items():
            print(f"{ms:8.2f}  {name[:150]}")
PY
