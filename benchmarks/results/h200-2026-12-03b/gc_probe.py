"""bench_engine with every garbage collection timed (gc.callbacks, time.monotonic like the engine's step trace):
at exit one JSON line with the count and total ms per generation and the ten longest collections (start, ms, gen),
to set against the step trace's `t` / `ms`: whether the third decode step after an admission holds a collection.

    python3 benchmarks/results/h200-2026-12-03b/gc_probe.py --model CKPT ... (bench_engine's arguments)
"""

import atexit
import gc
import json
import runpy
import sys
import time

runs: list[tuple[float, float, int]] = []
started: list[float] = []


def timed(phase: str, info: dict) -> None:
    if phase == "start":
        started.append(time.monotonic())
    elif started:
        begin = started.pop()
        runs.append((begin, time.monotonic() - begin, info["generation"]))


def report() -> None:
    per_gen = {g: [ms for _, ms, gen in runs if gen == g] for g in (0, 1, 2)}
    longest = sorted(runs, key=lambda r: -r[1])[:10]
    line = {"gc": {g: {"count": len(v), "ms": round(sum(v) * 1e3, 1)} for g, v in per_gen.items()}}
    line["longest"] = [[round(t, 4), round(ms * 1e3, 2), g] for t, ms, g in longest]
    print(json.dumps(line))


gc.callbacks.append(timed)
atexit.register(report)
sys.argv = ["bench_engine.py", *sys.argv[1:]]
runpy.run_path("benchmarks/bench_engine.py", run_name="__main__")
