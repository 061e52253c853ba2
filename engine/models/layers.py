"""Layers that more than one model family uses as they are."""

from __future__ import annotations

import torch
from torch import nn

from engine import kernels


class RMSNorm(nn.Module):
    """RMSNorm as MiniCPM4 and Qwen3 define it: normalise in fp32, round to the input dtype, then scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + update, norm(x + update)) in one pass."""
        return kernels.add_rms_norm(x, update, self.weight, self.eps)
