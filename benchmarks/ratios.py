"""Join our benchmark's JSON lines with the anchor's and print a Markdown table of both plus the ratios.

python benchmarks/ratios.py ours.jsonl anchor.jsonl --gpu "NVIDIA H100 80GB HBM3" --model voxcpm2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def by_concurrency(path: Path) -> dict[int, dict]:
    rows = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            if "concurrency" in row:
                rows[row["concurrency"]] = row
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("ours", type=Path)
    p.add_argument("anchor", type=Path)
    p.add_argument("--gpu", default="unknown GPU")
    p.add_argument("--model", default="")
    args = p.parse_args()
    ours, anchor = by_concurrency(args.ours), by_concurrency(args.anchor)
    print(f"{args.model} on {args.gpu}\n")
    # Both ratio columns are ours / anchor: higher is better for xRT (target >= 2.5 at c=256),
    # lower for TTFB (target <= 0.5).
    print("| c | TTFB p50 ms ours / anchor | RTF p90 ours / anchor | xRT ours / anchor | xRT ratio | TTFB ratio |")
    print("|---|---|---|---|---|---|")
    for c in sorted(set(ours) | set(anchor)):
        o, a = ours.get(c), anchor.get(c)
        if o is None or a is None:
            print(f"| {c} | only {'ours' if a is None else 'anchor'} ran at this concurrency |||||")
            continue
        xrt = o["xrt_aggregate"] / a["xrt_aggregate"]
        ttfb = o["ttfb_p50_ms"] / a["ttfb_p50_ms"]
        print(
            f"| {c} | {o['ttfb_p50_ms']} / {a['ttfb_p50_ms']} | {o['rtf_p90']} / {a['rtf_p90']} "
            f"| {o['xrt_aggregate']} / {a['xrt_aggregate']} | {xrt:.2f}x | {ttfb:.2f}x |"
        )


if __name__ == "__main__":
    main()
