"""What the engine hands back: audio chunks, finish reasons, model facts and load figures."""

from __future__ import annotations

import enum
import pickle
from dataclasses import dataclass
from typing import Any

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
    """One generated patch (one step's output: a VoxCPM latent patch, a Qwen3-TTS codec frame): its waveform and
    the latents that made it.

    `latents` ([patch_size, feat_dim] float32) lets a caller condition a later request on this audio
    (continuation mode, ModelInfo.continuation) without re-encoding the waveform.
    """

    request_id: str
    index: int
    samples: np.ndarray  # float32, mono, at ModelInfo.sample_rate
    latents: np.ndarray
    finish_reason: FinishReason | None = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled (protocol 5) with the arrays' bytes as they are, out of band in engine.ipc's messages: numpy's own
        pickling of two small arrays cost ten times the rest of a chunk, and a step hands a worker 50 chunks and more
        (51 chunks: 220 us before, 20 us now, on the development machine)."""
        if protocol < 5:
            return object.__reduce_ex__(self, protocol)
        return _chunk, (self.request_id, self.index, *_raw(self.samples), *_raw(self.latents), self.finish_reason)


def _raw(array: np.ndarray) -> tuple[pickle.PickleBuffer, str, tuple[int, ...]]:
    return pickle.PickleBuffer(np.ascontiguousarray(array)), array.dtype.str, array.shape


def _array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(buffer, dtype).reshape(shape)


def _chunk(
    request_id: str,
    index: int,
    samples: Any,
    samples_dtype: str,
    samples_shape: tuple[int, ...],
    latents: Any,
    latents_dtype: str,
    latents_shape: tuple[int, ...],
    finish_reason: FinishReason | None,
) -> AudioChunk:
    return AudioChunk(
        request_id,
        index,
        _array(samples, samples_dtype, samples_shape),
        _array(latents, latents_dtype, latents_shape),
        finish_reason,
    )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a server needs to know of the model it serves, filled by the model family's runner."""

    name: str  # e.g. "VoxCPM2" (the checkpoint's directory or repo name)
    family: str  # "voxcpm" (engine/models/registry.py)
    architecture: str  # the variant within the family: "voxcpm" | "voxcpm2"
    sample_rate: int  # output rate of the audio decoder
    encoder_sample_rate: int  # rate that encode_audio() expects
    patch_size: int  # a chunk's latents are [patch_size, feat_dim]
    feat_dim: int
    samples_per_patch: int
    # Which uploads make voices: "prompt" (continuation audio + transcript -> Prompt.latents), "reference"
    # (Prompt.reference_latents), "both"; () when the model clones no voices.
    voice_roles: tuple[str, ...]
    # Prompt.latents may be a previous request's chunk latents: a segment can continue the audio before it.
    continuation: bool
    speakers: tuple[str, ...] = ()  # preset voices (Prompt.speaker)
    instruction: bool = False  # Prompt.instruction is honoured
    languages: tuple[str, ...] = ()  # accepted Prompt.language values ("" is always accepted: the model decides)
    # Identifies the audio encoder (a digest of its weights): latents from encode_audio() fit every engine with the
    # same id, and only those. Stored voices are bound to it.
    audio_encoder_id: str = ""
    # LoRA limits: adapters resident at once (0: none served) and their max rank.
    max_loras: int = 0
    max_lora_rank: int = 0

    @property
    def supports_reference(self) -> bool:
        """Prompt.reference_latents is honoured (VoxCPM2 reference-audio conditioning)."""
        return "reference" in self.voice_roles


# Upper bounds of the step-duration histogram's buckets (EngineStats.step_counts), in seconds: a step at batch is
# tens of ms on a GPU, and one that outlasts the ~140 ms a just-started stream holds is what makes players run dry.
STEP_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.14, 0.2, 0.3, 0.5, 1.0)


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
    loras: tuple[str, ...] = ()  # names of the resident LoRA adapters
    # Every step since the start: how many took at most each of STEP_BUCKETS_S (not cumulative; the last count is
    # the longer ones), and their total time.
    step_counts: tuple[int, ...] = (0,) * (len(STEP_BUCKETS_S) + 1)
    step_s_total: float = 0.0
