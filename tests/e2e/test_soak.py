"""The soak in short (benchmarks/soak.py, issue 17): 300 sessions ending every way a client can end one against a
server process; every resource must come back to its plateau and SIGTERM must end the server within its drain
timeout. The full run (10,000 sessions, on the GPU with the full-size checkpoint) is in the README."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]


def test_a_short_soak_leaves_nothing_behind(tiny_checkpoint: Callable[..., Path]) -> None:
    command = [
        *(sys.executable, str(REPO / "benchmarks" / "soak.py"), "--model", str(tiny_checkpoint("voxcpm2", stop=False))),
        *("--sessions", "300", "--round", "75", "--concurrency", "30"),
        *("--", "--max-patches", "8"),
    ]
    run = subprocess.run(
        command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=600, check=False
    )
    lines = [orjson.loads(line) for line in run.stdout.splitlines()]
    summary = lines[-1]["summary"]
    failed = {key: value for key, value in summary.items() if isinstance(value, dict) and not value["ok"]}
    assert run.returncode == 0 and summary["ok"], (failed, run.stderr.decode()[-3000:])
    assert all(not line.get("failures") for line in lines[1:-1]), lines  # no session failed on the client's side
    # RSS per process adds up to the tree's, so a creeping process can be named (summary's `rose`).
    assert all(abs(sum(line["rss_mib_by_pid"].values()) - line["rss_mib"]) < 1 for line in lines[:-1]), lines
    assert set(summary["rss_mib"]["rose"]) <= set(lines[-2]["rss_mib_by_pid"]), summary
