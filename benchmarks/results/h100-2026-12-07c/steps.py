"""A step trace's c=1,024 bursts in brief: span.py's line (../h100-2026-12-07b) plus the median and p90 of each
burst's full decode steps (batch >= 1,000, nothing admitted).
    python3 steps.py TRACE_JSONL"""

import json
import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()]
starts = [i for i, x in enumerate(rows) if x["admitted"] >= 64 and x["batch"] >= 64]  # as span.py finds them
spans = subprocess.run(
    [sys.executable, str(here.parent / "h100-2026-12-07b" / "span.py"), sys.argv[1]], capture_output=True, text=True
).stdout.splitlines()
for start, line in zip(starts, spans, strict=True):
    burst = json.loads(line)
    decode = sorted(x["ms"] for x in rows[start : start + 60] if x["batch"] >= 1000 and x["admitted"] == 0)
    if decode:
        burst["decode_ms_p50_p90"] = [decode[len(decode) // 2], decode[int(0.9 * (len(decode) - 1))]]
    print(json.dumps(burst))
