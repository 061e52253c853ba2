"""Calls into the reference (qwen-tts 0.1.1) through `ref_worker.py` in a subprocess.

The reference needs transformers 4.57.x; scripts/setup.sh --test installs it with qwen-tts (and the
tokenizers / huggingface_hub / accelerate versions that transformers accepts) with `pip --target` into
`<venv>/qwen-tts-ref`, outside the project's own site-packages. `QWEN_TTS_REF` overrides the directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ref_worker.py")


def reference_dir() -> Path:
    path = Path(os.environ.get("QWEN_TTS_REF", Path(sys.prefix) / "qwen-tts-ref"))
    if not (path / "qwen_tts").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"the reference qwen-tts is not installed in {path} (scripts/setup.sh --test installs it)")
        pytest.skip(f"the reference qwen-tts is not installed in {path}")
    return path


def run_reference(jobs: list[dict], tmp: Path) -> list[dict]:
    """Run jobs (see ref_worker.py) in one reference process; returns one result dict per job."""
    ref = reference_dir()
    tmp.mkdir(parents=True, exist_ok=True)
    job_file, out_file = tmp / "jobs.pt", tmp / "results.pt"
    torch.save(jobs, job_file)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ref), os.environ.get("PYTHONPATH", "")])}
    env["TRANSFORMERS_VERBOSITY"] = "error"
    done = subprocess.run(
        [sys.executable, str(WORKER), str(job_file), str(out_file)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"reference worker failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return torch.load(out_file, weights_only=False)
