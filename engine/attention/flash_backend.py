"""flash-attn kernels: paged varlen prefill, paged decode, dense non-causal; imported lazily (CUDA only).

flash-attn runs fp16/bf16 only, and the sm90 build this project uses supports head_dim 64 and 128 only (the
released models' sizes). Other calls (fp32 models, tiny test checkpoints with head_dim 8) take SDPA instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import kernels
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttention, write_kv

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)


def _supported(q: torch.Tensor) -> bool:
    return q.shape[-1] in HEAD_DIMS and q.dtype in DTYPES


class FlashAttention:
    name = "flash_attn"

    def __init__(self) -> None:
        # Imported here so that CPU machines without flash-attn can import the package.
        from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

        self._func = flash_attn_func
        self._varlen = flash_attn_varlen_func
        self._kvcache = flash_attn_with_kvcache
        self._fallback = TorchAttention("sdpa")

    def paged(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        if not _supported(q):
            return self._fallback.paged(q, k, v, k_cache, v_cache, meta, scale)
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.decode_only:
            out = self._kvcache(
                q.unsqueeze(1),
                k_cache,
                v_cache,
                cache_seqlens=meta.seq_lens,
                block_table=meta.block_tables,
                softmax_scale=scale,
                causal=True,
            )
            return out.squeeze(1)
        if meta.context_free:
            # The dense varlen kernel (128-row tiles): with a block table flash-attn takes its split-KV decode
            # kernel (64-row tiles, keys gathered through the table), 28 of a c=1,024 admission's 531 ms.
            return self._varlen(
                q,
                k,
                v,
                cu_seqlens_q=meta.cu_seqlens_q,
                cu_seqlens_k=meta.cu_seqlens_q,
                max_seqlen_q=meta.max_seqlen_q,
                max_seqlen_k=meta.max_seqlen_q,
                softmax_scale=scale,
                causal=True,
            )
        cu_seqlens_k = F.pad(torch.cumsum(meta.seq_lens, 0, dtype=torch.int32), (1, 0))
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=meta.cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=meta.max_seqlen_q,
            max_seqlen_k=meta.max_seqlen_k,
            softmax_scale=scale,
            causal=True,
            block_table=meta.block_tables,
        )

    def dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        # Rows of a few tokens (LocDiT, LocEnc) waste flash-attn's 128-wide tiles: the tiny-row kernel instead.
        if not _supported(q) or q.shape[1] <= kernels.MAX_TINY_SEQ:
            return self._fallback.dense(q, k, v, scale)
        return self._func(q, k, v, softmax_scale=scale, causal=False)
