"""What a caller asks the engine for: the text, the conditioning, and the sampling knobs."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """Per-request generation settings. Defaults are the reference implementation's."""

    cfg_value: float = 2.0
    temperature: float = 1.0
    inference_timesteps: int = 10
    # None draws a fresh seed; a fixed seed makes the request reproducible (counter-based noise).
    seed: int | None = None
    # The reference never stops before patch `min_patches + 1` (`i > min_len` in its loop).
    min_patches: int = 2
    # None: the reference's cap, min(6 * target text tokens + 10, engine max_patches).
    max_patches: int | None = None
    # The name of a resident LoRA adapter to generate with (None: the base model).
    lora: str | None = None

    def validate(self) -> None:
        if not 0.0 <= self.cfg_value <= 10.0:
            raise ValueError(f"cfg_value must be within [0, 10], got {self.cfg_value}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be within [0, 2], got {self.temperature}")
        if not 1 <= self.inference_timesteps <= 100:
            raise ValueError(f"inference_timesteps must be within [1, 100], got {self.inference_timesteps}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be within [0, 2**63), got {self.seed}")
        if self.min_patches < 0:
            raise ValueError(f"min_patches must be >= 0, got {self.min_patches}")
        if self.max_patches is not None and self.max_patches < 1:
            raise ValueError(f"max_patches must be >= 1, got {self.max_patches}")
        if self.lora is not None and (not isinstance(self.lora, str) or not self.lora):
            raise ValueError(f"lora must be an adapter name, got {self.lora!r}")


@dataclass(frozen=True, slots=True)
class Prompt:
    """What a request's voice is conditioned on; each model family takes the parts its variant has (ModelInfo) and
    refuses the others.

    - `text` + `latents`: continuation; the model goes on from this audio, which speaks `text`. The latents come from
      `encode_audio(wav, padding="left")` or are a previous request's chunk latents (VoxCPM: VAE latents shaped
      [patches, patch_size, feat_dim], float32).
    - `reference_latents` (ModelInfo.voice_roles has "reference"; VoxCPM2): a voice reference, isolated from the
      text, from `encode_audio(wav, padding="right")`. Both may be given (VoxCPM2 reference + continuation).
    - `speaker` (one of ModelInfo.speakers), `instruction` (ModelInfo.instruction), `language` (one of
      ModelInfo.languages; "" lets the model decide).
    """

    text: str = ""
    latents: np.ndarray | None = None
    reference_latents: np.ndarray | None = None
    speaker: str = ""
    instruction: str = ""
    language: str = ""

    @property
    def is_empty(self) -> bool:
        return self.latents is None and self.reference_latents is None


def new_request_id() -> str:
    """32 random hex digits from the process's Mersenne Twister (which the random module reseeds in a forked child),
    not from the OS: os.urandom (uuid4, secrets) gives the GIL up, and a thread that does so for each of a burst's
    requests keeps the engine loop's thread from taking it (CPython makes the holder hand it over only when it did not
    change hands during the waiter's switch interval, and a release and re-take is a change). On the development
    machine the loop woke 20-50 ms after a burst's first request instead of ~1 ms: docs/benchmarks.md, "Twenty-ninth
    session"."""
    return f"{random.getrandbits(128):032x}"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    text: str
    prompt: Prompt = field(default_factory=Prompt)
    params: GenerationParams = field(default_factory=GenerationParams)
    request_id: str = field(default_factory=new_request_id)
    # time.monotonic() (one clock for every process of a host) when the caller made the request: a front end makes it
    # as the segment's text is released. The step trace compares it with when the engine took the request in.
    arrival_time: float = field(default_factory=time.monotonic)
