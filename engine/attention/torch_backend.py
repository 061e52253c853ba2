"""Attention in plain torch: paged causal attention over the KV pool, and dense bidirectional attention.

Two kernels share one gather: `math` (explicit matmul + fp32 softmax, used on CPU) and `sdpa`
(`F.scaled_dot_product_attention` with a boolean mask, the CUDA fallback when flash-attn is missing).
Everything is vectorised over sequences with shapes taken from the metadata's `max_seqlen_*`, so no
step reads a device value back to the host.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import kernels
from engine.attention.metadata import AttentionMetadata


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store the new positions' K/V ([N, kv_heads, head_dim]) at their flat slots of the paged pool."""
    kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, v.to(v_cache.dtype))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, kernel: str):
    """q [B, Lq, H, D], k/v [B, Lk, Hkv, D], mask bool [B, Lq, Lk] (True = attend) -> [B, Lq, H, D]."""
    if kernel == "sdpa":
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=None if mask is None else mask.unsqueeze(1),
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2)
    batch, len_q, heads, dim = q.shape
    kv_heads = k.shape[2]
    # Query head j reads kv head j // group (the repeat_interleave convention of SDPA's enable_gqa). At least fp32;
    # float64 stays float64: the tests' bit-exact batchings would otherwise depend on fp32 GEMMs, which some CPUs' BLAS
    # rounds differently for other batch sizes (AVX-512: one sequence against four, 4e-7 apart).
    compute = torch.promote_types(q.dtype, torch.float32)
    qg = q.reshape(batch, len_q, kv_heads, heads // kv_heads, dim).to(compute)
    scores = torch.einsum("bqhgd,bkhd->bhgqk", qg, k.to(compute)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    probs = scores.softmax(dim=-1)
    out = torch.einsum("bhgqk,bkhd->bqhgd", probs, v.to(compute))
    return out.reshape(batch, len_q, heads, dim).to(q.dtype)


class TorchAttention:
    """Backend with torch kernels. `kernel` is "math" (CPU) or "sdpa"."""

    def __init__(self, kernel: str = "math") -> None:
        if kernel not in ("math", "sdpa"):
            raise ValueError(f"unknown torch attention kernel {kernel!r}")
        self.kernel = kernel
        self.name = "torch" if kernel == "math" else "sdpa"

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
        """Causal attention of the packed new positions q [N, H, D] over cached + new K/V; writes k/v first."""
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        device = q.device
        block_size = k_cache.shape[1]
        cu = meta.cu_seqlens_q.long()
        seq_lens = meta.seq_lens.long()
        q_lens = cu[1:] - cu[:-1]
        ctx_lens = seq_lens - q_lens  # positions already in the cache before this step
        num_seqs = seq_lens.numel()

        # Queries padded to max_seqlen_q; padded rows repeat the last real one and are dropped below.
        q_off = torch.arange(meta.max_seqlen_q, device=device)
        q_index = torch.minimum(cu[:-1, None] + q_off, cu[1:, None] - 1).clamp(min=0)
        queries = q[q_index]  # [B, Lq, H, D]

        if meta.context_free:
            # Every key is a new position: read them as the queries are (in the cache's dtype, as the gather below
            # would), with no gather through the block table.
            k_pos, keys, values = q_off, k.to(k_cache.dtype)[q_index], v.to(v_cache.dtype)[q_index]
        else:
            # K/V of every sequence, padded to max_seqlen_k: gather through the block table.
            k_pos = torch.arange(meta.max_seqlen_k, device=device)
            blocks = meta.block_tables[:, k_pos // block_size].long().clamp(min=0)
            slots = blocks * block_size + k_pos % block_size  # [B, Lk]
            kv_heads, head_dim = k_cache.shape[-2:]
            keys = k_cache.view(-1, kv_heads, head_dim)[slots]
            values = v_cache.view(-1, kv_heads, head_dim)[slots]
        q_abs = ctx_lens[:, None] + q_off  # absolute position of each query in its sequence
        mask = (k_pos[None, None, :] <= q_abs[:, :, None]) & (k_pos[None, None, :] < seq_lens[:, None, None])
        # An empty sequence (a graph's padded row) attends its first key slot (the scratch block): with no key at
        # all its rows would be NaN, and NaN K/V in the scratch block reach real rows through the zero weights of
        # the padded block-table columns they gather.
        mask |= (k_pos == 0)[None, None, :] & (seq_lens == 0)[:, None, None]
        out = _attend(queries, keys, values, mask, scale, self.kernel)

        # Back to the packed axis: position n belongs to sequence b at offset n - cu[b]. Positions past the last
        # sequence (an admission padded to a size) take any row: theirs are discarded.
        n = torch.arange(q.shape[0], device=device)
        seq_of = torch.searchsorted(cu[1:], n, right=True).clamp(max=num_seqs - 1)
        return out[seq_of, (n - cu[seq_of]).clamp(max=meta.max_seqlen_q - 1)]

    def dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Bidirectional attention within each row: q [B, S, H, D], k/v [B, S, Hkv, D]. `sdpa` dispatches through
        engine.kernels (a fused kernel for tiny rows on CUDA, SDPA otherwise)."""
        if self.kernel == "sdpa":
            return kernels.dense_attention(q, k, v, scale)
        return _attend(q, k, v, None, scale, self.kernel)
