"""The contract between the VoxCPM runner (runner.py) and the model: one packed forward step.

A step carries B sequences. Prefilling sequences contribute their prompt positions, decoding ones a
single position (the patch generated last step, fed back as an audio position). All positions are
packed along one axis of length N; `cu_seqlens_q` marks where each sequence's positions start.
Every tensor lives on the model's device.

The model splits a step in two (`VoxCPMModel.backbone` then `.generate`): the backbone runs over the N packed
positions (variable, eager) and leaves per sequence only fixed-shape hiddens [B, ...]; everything after that
(the CFM loop, the stop head) has fixed shapes per B, so the runtime can graph it per batch bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.attention.metadata import AttentionMetadata


@dataclass(slots=True)
class BackboneInputs:
    """What the LM backbone reads: the packed positions (any number N) and where each sequence ends."""

    # per position, packed: [N]
    token_ids: torch.Tensor  # int64, text token id (0 at audio positions)
    feats: torch.Tensor  # [N, P, D] latent patch per position (zeros at text positions)
    audio_mask: torch.Tensor  # bool [N], True at audio positions (prompt audio or a fed-back patch)
    positions: torch.Tensor  # int64 [N], position within its sequence (for RoPE)
    # per sequence: [B]
    last_index: torch.Tensor  # int64 [B], packed index of each sequence's last position
    attn: AttentionMetadata
    # Known on the host: no position is audio, so the backbone skips LocEnc without reading audio_mask (a
    # read that would sync with the host, which graphs cannot). False means "may hold audio".
    text_only: bool
    # int32 [N], the LoRA adapter slot of each position's sequence (0: none); None: no adapter in this step.
    adapter: torch.Tensor | None = field(default=None, kw_only=True)


@dataclass(slots=True)
class ModelInputs(BackboneInputs):
    """A whole step: the backbone's inputs plus the per-sequence sampling settings of the generation."""

    # per sequence: [B]
    cfg_value: torch.Tensor  # float32 [B]
    temperature: torch.Tensor  # float32 [B]
    timesteps: torch.Tensor  # int64 [B], CFM Euler steps per sequence (rows may differ)
    noise: torch.Tensor  # float32 [B, D, P], standard normal CFM start (scaled by temperature inside)


@dataclass(slots=True)
class ModelOutputs:
    patches: torch.Tensor  # float32 [B, P, D], the generated latent patch per sequence
    stop: torch.Tensor  # bool [B], the stop head's verdict (argmax == 1) on the hidden that made the patch
