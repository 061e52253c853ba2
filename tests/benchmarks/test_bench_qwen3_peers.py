"""benchmarks/bench_qwen3_peers.py without a GPU or the peers: it speaks bench_engine's sentence, and a peer that
cannot run (here: not installed) gives an error line while the next peer still runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import bench_engine, bench_qwen3_peers

REPO = Path(__file__).resolve().parents[2]


def test_same_sentence_as_bench_engine():
    assert bench_qwen3_peers.TEXT == bench_engine.TEXT


def test_a_peer_that_cannot_run_reports_an_error_and_the_next_runs(tmp_path):
    script = REPO / "benchmarks" / "bench_qwen3_peers.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--model", str(tmp_path), "--site-root", str(tmp_path / "no-site")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["engine"] for line in lines] == sorted(bench_qwen3_peers.PEERS)
    assert all(line["error"].startswith("exit 1") for line in lines)
    assert proc.stderr.count("ModuleNotFoundError: No module named 'faster_qwen3_tts'") == 2
