"""Per c=1,024 burst of a step trace: the prefills ahead of its first step (count, positions, host ms), its arrival
span, the time from its first arrival to its first step's start and end, and to the end of its last step.
    python3 span.py TRACE_JSONL"""

import json
import sys
from pathlib import Path

rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()]
starts = [i for i, x in enumerate(rows) if x["admitted"] >= 64 and x["batch"] >= 64]
for n, i in enumerate(starts):
    first = rows[i]
    ahead = [x for x in rows[max(0, i - 40) : i] if x.get("ahead") and x["batch"] == 0]
    arrival = first["arrival"]
    ends = [x["t"] + x["ms"] / 1e3 for x in rows[i : i + 60] if x["batch"] >= 64]
    print(
        json.dumps(
            {
                "burst": n,
                "ahead": [[x["ahead"], x["positions"], x["ms"]] for x in ahead],
                "first_step": [first["admitted"], first["positions"], first["ms"]],
                "arrival_ms": round(1e3 * (arrival[1] - arrival[0]), 1),
                "first_step_start_ms": round(1e3 * (first["t"] - arrival[0]), 1),
                "first_step_end_ms": round(1e3 * (ends[0] - arrival[0]), 1),
                "last_step_end_s": round(ends[-1] - arrival[0], 3),
                "steps": len(ends),
            }
        )
    )
