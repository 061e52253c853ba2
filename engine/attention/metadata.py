"""Where a step's causal attention layers read and write the paged KV pool: shared by every model family."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Where a step's causal layers (VoxCPM's base and residual LMs, for one) read and write their paged KV cache."""

    cu_seqlens_q: torch.Tensor  # int32 [B+1], offsets of each sequence's new positions in the packed axis
    seq_lens: torch.Tensor  # int32 [B], KV length of each sequence after this step (cached + new)
    max_seqlen_q: int
    max_seqlen_k: int
    slot_mapping: torch.Tensor  # int64 [N], flat KV slot (block_id * block_size + offset) per new position
    block_tables: torch.Tensor  # int32 [B, max_blocks], padded with a scratch block; read up to seq_lens
    decode_only: bool  # every sequence has exactly one new position
    # No sequence has K/V cached before this step (whole prompts): its keys are exactly its new positions, so a
    # backend may attend over the packed k/v as they come instead of gathering them back through the block table.
    context_free: bool = False
