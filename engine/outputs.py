"""What the engine hands back: audio chunks, finish reasons, model facts and load figures."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class FinishReason(enum.Enum):
    STOP = "stop"  # the stop head fired (after the minimum length)
    LENGTH = "length"  # hit the request's patch cap
    CANCELLED = "cancelled"
    ERROR = "error"


class EngineError(RuntimeError):
    """The engine cannot serve the request (bad input, engine failure, shutdown)."""


@dataclass(slots=True)
class AudioChunk:
    """One generated patch: its waveform and the latents that made it.

    `latents` ([patch_size, feat_dim] float32) lets a caller condition a later request on this audio
    (continuation mode) without re-encoding the waveform.
    """

    request_id: str
    index: int
    samples: np.ndarray  # float32, mono, at ModelInfo.sample_rate
    latents: np.ndarray
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str  # e.g. "voxcpm2"
    architecture: str  # "voxcpm" | "voxcpm2"
    sample_rate: int  # output rate of the VAE decoder
    encoder_sample_rate: int  # rate that encode_audio() expects
    patch_size: int
    feat_dim: int
    samples_per_patch: int
    supports_reference: bool  # VoxCPM2 reference-audio conditioning
    # Identifies the audio encoder (a digest of its weights): latents from encode_audio() fit every engine with the
    # same id, and only those. Stored voices are bound to it.
    audio_encoder_id: str = ""


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int
    waiting: int
    paused: int
    max_num_seqs: int
    kv_blocks_free: int
    kv_blocks_total: int
    steps: int
    step_ms_avg: float  # exponential moving average over recent steps
    batch_size_avg: float
    healthy: bool
