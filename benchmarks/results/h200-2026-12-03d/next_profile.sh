# For a next session's call (what call1.sh ran out of device time for): where the channels-last upsampling's ~5 ms a
# B=1,024 decode step go. Here first: `python benchmarks/ab_trees.py prepare --ref HEAD --out .carry/base` and
# `git apply benchmarks/results/h200-2026-12-03c/call5/channels_last_upsampling.patch`; carry .carry. Per tree,
# profile_step's graphs (the VAE's among them) and its eager kernels, then the kernels whose time differs most.
source scripts/device_env.sh > $OUT/gpu.txt
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out /tmp/c2 >/dev/null 2>>$OUT/err.txt; t checkpoint $?
timeout 400 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/profile_step.py --model /tmp/c2 --batch 1024 --fp8-gemms on --fp8-backbone on --top 60 2>>$OUT/err.txt | grep '"batch"' > $OUT/profile.jsonl; t profile $?
python3 - "$OUT/profile.jsonl" <<'PY'
import json, sys
lines = {d["tree"]: d for d in map(json.loads, open(sys.argv[1]))}
for tree, d in lines.items():
    print(json.dumps({"tree": tree} | {k: v for k, v in d.items() if not isinstance(v, (list, dict))}))
if len(lines) == 2:
    base, new = (lines[t]["kernels_eager"]["top_ms"] for t in ("base", "new"))
    diff = {k: round(new.get(k, 0) - base.get(k, 0), 3) for k in base.keys() | new.keys()}
    for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15]:
        print(json.dumps({"kernel": k[:90], "new_minus_base_ms": v, "base": base.get(k), "new": new.get(k)}))
PY
tail -3 $OUT/err.txt
