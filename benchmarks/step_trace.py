"""Read an engine step trace (`--step-trace-dir`) beside the ws_latency levels it ran under.

For every level line of ws_latency's output, the steps that started within its window (`started_monotonic_s`,
`wall_s`; one host clock), summarised as one JSON line: the level's format and sessions, the step count, the median
and longest step, how many outlasted `--over-ms` (by default 140: the audio a stream holds after its first VoxCPM2
patch), and the first admissions (seconds into the level, step ms, requests admitted, prompt positions, and when
those requests were made and taken in by the engine, first and last), which show how a burst of arrivals was cut
into waves and what it waited for.

    python benchmarks/step_trace.py --trace DIR/engine-0.jsonl --levels ws.jsonl [--over-ms 140] [--admissions 4]

A trace of several ws_latency runs may be given: each level takes only the steps within its own window.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import orjson


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.startswith(b"{")]


def summarise(level: dict[str, Any], steps: list[dict[str, Any]], over_ms: float, admissions: int) -> dict[str, Any]:
    """One level's steps: those that started within its window."""
    start = level["started_monotonic_s"]
    mine = [step for step in steps if start <= step["t"] <= start + level["wall_s"]]
    durations = [step["ms"] for step in mine]
    return {
        "format": level["format"],
        "sessions": level["sessions"],
        "steps": len(mine),
        "step_ms_p50": round(statistics.median(durations), 2) if mine else None,
        "step_ms_max": max(durations, default=None),
        f"steps_over_{over_ms:g}_ms": sum(ms > over_ms for ms in durations),
        "admissions": [admission(step, start) for step in mine if step["admitted"]][:admissions],
    }


def admission(step: dict[str, Any], start: float) -> list[Any]:
    """[seconds into the level, step ms, requests, prompt positions], then, from traces that have them, when the
    admitted requests were made (their segments released) and when the engine took them in: first and last, in
    seconds into the level."""
    line = [round(step["t"] - start, 3), step["ms"], step["admitted"], step["positions"]]
    return line + [[round(t - start, 3) for t in step[key]] for key in ("arrival", "received") if key in step]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="an engine's step trace (engine-N.jsonl)")
    parser.add_argument("--levels", type=Path, required=True, help="ws_latency's JSON lines")
    parser.add_argument("--over-ms", type=float, default=140.0, help="count the steps longer than this")
    parser.add_argument("--admissions", type=int, default=4, help="list this many of each level's first admissions")
    args = parser.parse_args(argv)
    steps = read_lines(args.trace)
    for level in read_lines(args.levels):
        if "started_monotonic_s" in level:
            print(orjson.dumps(summarise(level, steps, args.over_ms, args.admissions)).decode())


if __name__ == "__main__":
    main()
