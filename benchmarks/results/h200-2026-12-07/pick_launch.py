"""Pick the gate/up launch for the engine A/B from gate_up_bench's lines (base tree: the engine's launch before;
new tree: the warp-specialised kernel's sweep): the new tree's fastest at the largest batch, written into
engine/kernels/triton_ops.py's GATE_UP_LAUNCH of the tree sent, if it beats the base.
    python3 pick_launch.py GATE_UP_JSONL      exit 0: A/B worth running; 1: the base kernel is faster"""

import json
import re
import sys
from pathlib import Path

lines = [json.loads(x) for x in Path(sys.argv[1]).read_text().splitlines() if '"ms"' in x]
batch = max(x["batch"] for x in lines)
ours = [x for x in lines if x["batch"] == batch and x.get("path") == "gate_up_silu_fp8"]
base = min(x["ms"] for x in ours if x["tree"] == "base")
best = min((x for x in ours if x["tree"] == "new" and x["rel_to_engine"] < 0.02), key=lambda x: x["ms"])
launch = (best["BM"], best["BK"], best["warps"], best["stages"], best["warp_specialized"])
print(json.dumps({"batch": batch, "base_ms": base, "best_new_ms": best["ms"], "launch": launch}))
if best["ms"] >= base:
    sys.exit(1)
ops = Path("engine/kernels/triton_ops.py")
text = re.sub(r"^GATE_UP_LAUNCH = .*$", f"GATE_UP_LAUNCH = {launch!r}", ops.read_text(), flags=re.M)
ops.write_text(text)
print(re.search(r"^GATE_UP_LAUNCH = .*$", text, flags=re.M).group(0))
