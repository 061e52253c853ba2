"""Counter-based standard-normal noise: a pure function of (seed, step, element).

The CFM start noise of patch `step` of a request is `standard_normal(seed, step)`, whatever batch the
request runs in and on whichever device, so a seeded request is reproducible alone or batched, on CPU or
CUDA. Everything is elementwise torch integer arithmetic on fixed shapes: no torch.Generator (and no
per-row generator loop), nothing that a CUDA graph cannot capture.

The hash is lowbias32 (C. Wellons' integer-hash search), a 32-bit bijection, chained over the key words.
Products are split so that every intermediate fits in int64 without wrapping: the integer stream is
bit-identical on every backend. Box-Muller runs in float64, so the float32 results agree across devices
up to the final rounding.
"""

from __future__ import annotations

import math
import random
from typing import Protocol

import torch

from engine import kernels

_MASK32 = 0xFFFFFFFF


class NoiseSource(Protocol):
    """Rows of noise keyed by (seed, step): `standard_normal`, or draws a parity test injects."""

    def __call__(self, seeds: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor: ...


def draw_seed() -> int:
    """A fresh seed for a request that did not ask for one (GenerationParams.seed range), from the process's Mersenne
    Twister rather than the OS, which would give the GIL up for every request (engine.params.new_request_id says
    why that matters)."""
    return random.getrandbits(63)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32, with no int64 overflow."""
    low = x * (c & 0xFFFF)  # < 2**48
    high = (x * (c >> 16)) & 0xFFFF  # only these bits survive the shift by 16 modulo 2**32
    return (low + (high << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _uniform(bits: torch.Tensor) -> torch.Tensor:
    """32 random bits -> float64 in the open interval (0, 1)."""
    return (bits.double() + 0.5) * 2.0**-32


def _key(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    key = _mix32((seeds & _MASK32) ^ 0x9E3779B9)
    key = _mix32(key ^ (seeds >> 32))
    return _mix32(key ^ (steps & _MASK32)).unsqueeze(1)  # [B, 1]


def _bits(seeds: torch.Tensor, steps: torch.Tensor, count: int) -> torch.Tensor:
    """int64 [B, count]: 32 random bits per counter 0..count-1 of each row's (seed, step) stream."""
    key = _key(seeds, steps)
    counters = torch.arange(count, device=seeds.device, dtype=torch.int64)
    return _mix32(_mix32(key ^ counters) ^ key)


def standard_normal(seeds: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """float32 [B, *shape] of N(0, 1) noise; row b depends only on (seeds[b], steps[b]).

    seeds: int64 [B] in [0, 2**63); steps: int64 [B] in [0, 2**32). Element j of a row uses the counters
    2j and 2j + 1 (one Box-Muller pair, cosine branch).
    """
    numel = math.prod(shape)
    bits = _bits(seeds, steps, 2 * numel).view(-1, numel, 2)  # [B, numel, (u1, u2)]
    u1, u2 = _uniform(bits[..., 0]), _uniform(bits[..., 1])
    normal = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return normal.float().view(-1, *shape)


def uniform(seeds: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """float64 [B, *shape] uniform in (0, 1), keyed like `standard_normal` (element j uses counter j), for
    discrete draws (e.g. Gumbel-max sampling of token ids). On CUDA one fused kernel gives the same bits
    (`engine.kernels.counter_uniform`; this chain is ~60 elementwise launches, 15 times a Qwen3-TTS frame)."""
    return kernels.counter_uniform(seeds, steps, math.prod(shape)).view(-1, *shape)


def uniform_torch(seeds: torch.Tensor, steps: torch.Tensor, count: int) -> torch.Tensor:
    """float64 [B, count]: `uniform`'s values in plain torch (the twin of the fused kernel)."""
    return _uniform(_bits(seeds, steps, count))
