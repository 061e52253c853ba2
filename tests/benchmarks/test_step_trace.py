"""benchmarks/step_trace.py: each ws_latency level gets the steps of its own window, summarised."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from benchmarks.step_trace import main


def step(t: float, ms: float, admitted: int = 0, positions: int = 0) -> dict:
    return {"t": t, "ms": ms, "batch": 4, "admitted": admitted, "positions": positions, "waiting": 0}


def test_each_level_gets_the_steps_of_its_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "engine-0.jsonl"
    steps = [step(5.0, 10.0, 1, 21)]  # the warm-up, before any level
    steps += [step(100.1, 180.0, 3, 63), step(100.3, 150.0, 1, 21), step(100.5, 100.0), step(100.6, 90.0)]
    steps += [
        step(200.2, 120.0, 4, 84) | {"arrival": [200.04, 200.11], "received": [200.05, 200.19]},
        step(200.4, 141.0),
    ]
    trace.write_bytes(b"".join(orjson.dumps(s) + b"\n" for s in steps))
    levels = tmp_path / "ws.jsonl"
    lines = [
        {"format": "opus", "sessions": 4, "started_monotonic_s": 100.0, "wall_s": 1.0},
        {"tree": "new"},  # ab_trees' tag lines and the like carry no window
        {"format": "pcm_s16le", "sessions": 4, "started_monotonic_s": 200.0, "wall_s": 1.0},
    ]
    levels.write_bytes(b"log line\n" + b"".join(orjson.dumps(line) + b"\n" for line in lines))
    main(["--trace", str(trace), "--levels", str(levels), "--admissions", "1"])
    first, second = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert first == {
        "format": "opus",
        "sessions": 4,
        "steps": 4,
        "step_ms_p50": 125.0,
        "step_ms_max": 180.0,
        "steps_over_140_ms": 2,
        "admissions": [[0.1, 180.0, 3, 63]],
    }
    assert (second["steps"], second["steps_over_140_ms"], second["admissions"]) == (
        2,
        1,
        [[0.2, 120.0, 4, 84, [0.04, 0.11], [0.05, 0.19]]],
    )
