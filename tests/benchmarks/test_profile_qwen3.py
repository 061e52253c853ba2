"""benchmarks/profile_qwen3.py on the CPU (a tiny random Base checkpoint): every key of its lines, the admission
split adding up to the admitting step, and no graph or kernel timings without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.profile_qwen3 import profile
from engine.engine_core import EngineCore
from engine.models.qwen3tts.make_checkpoint import make_checkpoint
from tests.engine.helpers import engine_config

SPLIT = {"slot_state", "embed", "prefill", "first_c0", "priming", "frame", "rest", "total", "prefill_graphed"}
PIECES = ("engine_step", "frame_eager", "talker_decode", "predictor", "codec_decoder", "choose_c0")


def test_lines_on_the_cpu(tmp_path: Path) -> None:
    core = EngineCore(engine_config(make_checkpoint("base-0.6b", "tiny", tmp_path / "ck"), max_model_len=256))
    with torch.inference_mode():
        one = profile(core, 1, steps=2, top=5, ref_frames=4)
        two = profile(core, 2, steps=2, top=5, ref_frames=4)
    for key in ("admit_split", "admit_split_clone"):
        split = one[key]
        assert set(split) == SPLIT
        pieces = [v for k, v in split.items() if k not in ("total", "prefill_graphed")]
        assert split["total"] == pytest.approx(sum(pieces), abs=0.01)
        assert split["prefill"] > 0 and split["first_c0"] > 0 and split["frame"] > 0
        assert split["prefill_graphed"] is False  # the CPU prefills eagerly
    assert one["admit_split"]["priming"] == 0 < one["admit_split_clone"]["priming"]
    assert "admit_split" not in two
    for line in (one, two):
        assert all(line[k] > 0 for k in ("admit_first", "admit", "make_prompt", *PIECES))
        assert line["frame_graph"] is line["host"] is line["kernels_frame"] is line["kernels_admit"] is None
    assert not core.scheduler.requests  # every request it made is gone
