"""LocDiT: the flow-matching velocity estimator of VoxCPM v1 and v2 in one module.

Sequence per row (bidirectional MiniCPM4, RoPE over positions 0..S-1), output = out_proj of the last P tokens:
- v1 (`mu_tokens=0`):  [mu + t, cond(P), x(P)]          (voxcpm `modules/locdit/local_dit.py`)
- v2 (`mu_tokens=2`):  [mu_1, mu_2, t, cond(P), x(P)]   (voxcpm `modules/locdit/local_dit_v2.py`; mu is
  cat(lm_to_dit, res_to_dit) split into two tokens)
with t = time_mlp(sinusoid(t)) + delta_time_mlp(sinusoid(dt)). Latents are [rows, P, D] throughout.

The solver calls it on a CFG batch of 2B rows (conditional half, then the half with mu = 0). The dt token, the
same in every Euler step outside mean mode, is built once per patch (`CFM.begin`); `context` (mu and cond tokens of
the 2B rows, one small GEMM) once per step, from the per-row solver state whose rows the runner takes as a prefix.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.attention import AttentionBackend
from engine.models.voxcpm.config import MiniCPM4Config
from engine.models.voxcpm.minicpm4 import MiniCPM4


def sinusoid(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """The reference SinusoidalPosEmb, computed in t's dtype (as the reference does). t [R] -> [R, dim]."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -step)
    args = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((args.sin(), args.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LocDiT(nn.Module):
    def __init__(
        self,
        config: MiniCPM4Config,
        feat_dim: int,
        patch_size: int,
        mu_tokens: int,
        backend: AttentionBackend,
    ) -> None:
        super().__init__()
        if mu_tokens not in (0, 2):
            raise ValueError("mu_tokens must be 0 (VoxCPM v1) or 2 (VoxCPM2)")
        hidden = config.hidden_size
        self.hidden = hidden
        self.mu_tokens = mu_tokens
        self.patch_size = patch_size
        self.in_proj = nn.Linear(feat_dim, hidden)
        self.cond_proj = nn.Linear(feat_dim, hidden)
        self.out_proj = nn.Linear(hidden, feat_dim)
        self.time_mlp = TimestepEmbedding(hidden)
        self.delta_time_mlp = TimestepEmbedding(hidden)
        self.decoder = MiniCPM4(config, backend, rope_length=mu_tokens + 1 + 2 * patch_size)

    def use_fp8(self) -> None:
        """The decoder's GEMMs in FP8 (MiniCPM4.use_fp8): all of the LocDiT's per-token GEMM work but in_proj/out_proj
        (64 features wide) and the per-row time and cond projections, the MLPs block-scaled. Call once, after
        loading."""
        self.decoder.use_fp8()

    def context(self, mu: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-patch constants of the CFG batch: mu [B, mu_dim], cond [B, P, D] -> (mu part [2B, ...], cond tokens)."""
        mu2 = torch.cat((mu, torch.zeros_like(mu)))  # classifier-free guidance: the second half drops mu
        if self.mu_tokens:
            mu2 = mu2.view(mu2.shape[0], self.mu_tokens, self.hidden)
        return mu2, self.cond_proj(cond).repeat(2, 1, 1)

    def time_token(self, t: torch.Tensor) -> torch.Tensor:
        """t [B] (model dtype) -> [B, hidden]."""
        return self.time_mlp(sinusoid(t, self.hidden).to(self.in_proj.weight.dtype))

    def delta_token(self, dt: torch.Tensor) -> torch.Tensor:
        """dt [B] (model dtype) -> [B, hidden]; added to the time token."""
        return self.delta_time_mlp(sinusoid(dt, self.hidden).to(self.in_proj.weight.dtype))

    def forward(self, x: torch.Tensor, time: torch.Tensor, mu: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Velocity for x [R, P, D] given the time token [R, hidden] and `context()`'s mu part and cond tokens."""
        prefix = torch.cat((mu, time.unsqueeze(1)), dim=1) if self.mu_tokens else (mu + time).unsqueeze(1)
        hidden = self.decoder(torch.cat((prefix, cond, self.in_proj(x)), dim=1), keep=self.patch_size)
        return self.out_proj(hidden)
