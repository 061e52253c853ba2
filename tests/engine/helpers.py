"""Builders shared by the engine tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine.config import EngineConfig
from engine.models.voxcpm.prompt import HostPrompt, reference_patch_cap
from engine.pacing import AdmissionPacer
from engine.params import GenerationParams
from engine.sequence import Sequence

PATCH_SIZE = 2
FEAT_DIM = 4


def make_seq(
    request_id: str,
    num_prompt: int = 8,
    num_target_tokens: int = 4,
    params: GenerationParams | None = None,
    audio_tail: int = 0,
) -> Sequence:
    """A (VoxCPM) sequence of `num_prompt` positions whose last `audio_tail` positions are prompt audio."""
    audio_mask = np.zeros(num_prompt, dtype=bool)
    if audio_tail:
        audio_mask[-audio_tail:] = True
    feats = np.zeros((num_prompt, PATCH_SIZE, FEAT_DIM), dtype=np.float32)
    feats[audio_mask] = np.arange(audio_tail, dtype=np.float32)[:, None, None] + 1
    prompt = HostPrompt(
        token_ids=np.where(audio_mask, 0, 5).astype(np.int64),
        feats=feats,
        audio_mask=audio_mask,
        patch_cap=reference_patch_cap(num_target_tokens),
    )
    return Sequence(request_id=request_id, prompt=prompt, params=params or GenerationParams(), seed=0)


def engine_config(checkpoint: Path, **overrides: Any) -> EngineConfig:
    """A small CPU engine for tiny checkpoints: fp32, few slots, short requests, small KV blocks, and admissions that
    do not depend on the machine's speed (no pacing: tests compare batchings bit for bit; pacing's tests ask for it)."""
    fields: dict[str, Any] = dict(
        model=str(checkpoint),
        device="cpu",
        dtype="float32",
        max_num_seqs=4,
        max_model_len=128,
        kv_block_size=16,
        max_patches=12,
        coalesce_ms=0.0,
        pace_admissions=False,
    )
    fields.update(overrides)
    return EngineConfig(**fields)


PATCH_S = 0.16  # a VoxCPM2 patch, in seconds


class FakeClock:
    """A monotonic clock that a test moves (`clock.now = ...`)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_pacer(clock: FakeClock, **overrides: Any) -> AdmissionPacer:
    """A pacer of PATCH_S patches: max_prefill_tokens 4000, margin 50 ms, hold at most 500 ms unless overridden."""
    fields: dict[str, Any] = dict(
        model="unused", max_prefill_tokens=4000, pacing_margin_ms=50.0, pacing_max_hold_ms=500.0
    )
    fields.update(overrides)
    return AdmissionPacer(EngineConfig(**fields), PATCH_S, clock)
