"""LocEnc: one latent patch [P, D] -> one LM-width embedding, via a bidirectional MiniCPM4 over [CLS, frames]."""

from __future__ import annotations

import torch
from torch import nn

from engine.attention import AttentionBackend
from engine.models.voxcpm.config import MiniCPM4Config
from engine.models.voxcpm.minicpm4 import MiniCPM4


class LocEnc(nn.Module):
    def __init__(self, config: MiniCPM4Config, feat_dim: int, patch_size: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.empty(1, 1, 1, config.hidden_size))
        self.in_proj = nn.Linear(feat_dim, config.hidden_size)
        self.encoder = MiniCPM4(config, backend, rope_length=patch_size + 1)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [M, P, D] -> [M, hidden_dim] (the CLS token's output)."""
        x = self.in_proj(feats)
        cls = self.special_token.view(1, 1, -1).expand(x.shape[0], 1, -1)
        return self.encoder(torch.cat((cls, x), dim=1))[:, 0]
