"""A step trace's c=1,024 bursts in brief: span.py's line plus the median and p90 of the burst's full decode steps.
python3 steps.py TRACE_JSONL"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()]
decode = sorted(x["ms"] for x in rows if x["batch"] >= 1000 and x["admitted"] == 0)
spans = subprocess.run(
    [sys.executable, str(here.parent / "h100-2026-12-07b" / "span.py"), sys.argv[1]], capture_output=True, text=True
).stdout.splitlines()
for line in spans:
    burst = json.loads(line)
    if decode:
        burst["decode_ms_p50_p90"] = [statistics.median(decode), decode[int(0.9 * (len(decode) - 1))]]
    print(json.dumps(burst))
