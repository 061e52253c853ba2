"""Each c=1,024 burst of a step trace (ab_trees.py runs base, then new, into one file): arrival span, admissions,
decode step median, and the bench lines' xRT / RTF p90 / TTFB p50.   python3 bursts.py BENCH_JSONL TRACE_JSONL"""

import json
import statistics
import sys
from pathlib import Path

for line in Path(sys.argv[1]).read_text().splitlines():
    d = json.loads(line)
    print(json.dumps({k: d.get(k) for k in ("r", "tree", "ttfb_p50_ms", "rtf_mean", "rtf_p90", "xrt_aggregate")}))
rows = [json.loads(line) for line in Path(sys.argv[2]).read_text().splitlines()]
starts = [i for i, x in enumerate(rows) if x["admitted"] and x["batch"] >= 64 and (i == 0 or rows[i - 1]["batch"] < 64)]
for n, s in enumerate(starts):
    burst = [x for x in rows[s : s + 62] if x["batch"] >= 64]
    decode = [x["ms"] for x in burst if not x["admitted"]]
    admissions = [(x["admitted"], x["ms"]) for x in burst if x["admitted"]]
    arrival = [x["arrival"] for x in burst if x["admitted"]]
    print(
        json.dumps(
            {
                "trace": sys.argv[2].rsplit("/", 1)[-1],
                "burst": n,
                "admissions": admissions,
                "arrival_ms": round(1e3 * (max(a[1] for a in arrival) - min(a[0] for a in arrival)), 1),
                "decode_ms_median": statistics.median(decode),
                "decode_steps": len(decode),
                "first_decode": decode[:4],
            }
        )
    )
