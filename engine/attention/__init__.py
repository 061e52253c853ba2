"""Attention backends for the model's two kinds of attention.

- `paged(q, k, v, k_cache, v_cache, meta, scale)`: causal attention for the LMs. Writes the new K/V at
  `meta.slot_mapping` into the pool ([num_blocks, block_size, kv_heads, head_dim]) and attends over each
  sequence's cached + new positions through `meta.block_tables`. q [N, H, D] packed -> [N, H, D].
- `dense(q, k, v, scale)`: bidirectional attention inside tiny fixed-length rows (LocEnc, LocDiT).
  q [B, S, H, D], k/v [B, S, Hkv, D] -> [B, S, H, D].

Metadata is passed explicitly on every call; no backend keeps per-step state.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttention

__all__ = ["AttentionBackend", "TorchAttention", "get_attention_backend"]


class AttentionBackend(Protocol):
    name: str

    def paged(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...

    def dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor: ...


def _flash_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def get_attention_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """Pick a backend: "auto" = flash-attn on CUDA when importable, else SDPA on CUDA, plain torch on CPU."""
    on_cuda = torch.device(device).type == "cuda"
    if name == "auto":
        name = ("flash_attn" if _flash_available() else "sdpa") if on_cuda else "torch"
    if name == "flash_attn":
        if not on_cuda:
            raise ValueError("the flash_attn attention backend needs a CUDA device")
        from engine.attention.flash_backend import FlashAttention

        return FlashAttention()
    if name == "sdpa":
        return TorchAttention("sdpa")
    if name == "torch":
        return TorchAttention("math")
    raise ValueError(f"unknown attention backend {name!r} (auto | flash_attn | sdpa | torch)")
