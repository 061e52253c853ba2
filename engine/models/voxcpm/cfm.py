"""The CFM sampler: Euler over a sway-scheduled t-span with classifier-free guidance and CFG-Zero*.

Reference: voxcpm `modules/locdit/unified_cfm.py` (`forward` + `solve_euler`). Per row of the batch it takes
its own cfg_value, temperature and number of Euler steps n. All rows run max(n) iterations; iteration k of a
row with n < k has dt = 0 and leaves it unchanged, so rows with different n share one batch.

The schedule (t_k, dt_k) of every n is precomputed with the reference's exact arithmetic: t_span in the model
dtype, then t and dt carried by subtraction (t <- t - dt; dt <- t - t_span[k+1]) rather than read from t_span.
CFG-Zero*: the first max(1, int(0.04 * (n + 1))) iterations use zero velocity (no estimator call), and the
guided velocity is v_u * s + cfg * (v_c - v_u * s) with s = <v_c, v_u> / (|v_u|^2 + 1e-8).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.voxcpm.locdit import LocDiT

MAX_TIMESTEPS = 100  # GenerationParams allows 1..100 Euler steps
SWAY_COEF = 1.0


def euler_schedule(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_k, dt_k) for k = 1..n, exactly as the reference solver computes them in `dtype` (on the CPU)."""
    t_span = torch.linspace(1, 0, n + 1, dtype=dtype)
    t_span = t_span + SWAY_COEF * (torch.cos(torch.pi / 2 * t_span) - 1 + t_span)
    t, dt = t_span[0], t_span[0] - t_span[1]
    ts, dts = [], []
    for step in range(1, n + 1):
        ts.append(t)
        dts.append(dt)
        t = t - dt
        if step < n:
            dt = t - t_span[step + 1]
    return torch.stack(ts), torch.stack(dts)


def zero_init_steps(n: int) -> int:
    return max(1, int((n + 1) * 0.04))


class CFM(nn.Module):
    def __init__(self, estimator: LocDiT, mean_mode: bool) -> None:
        super().__init__()
        self.estimator = estimator
        self.mean_mode = mean_mode
        self._tables: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def schedule_tables(
        self, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """t [MAX+1, MAX], dt [MAX+1, MAX] (0 past row n) and zero-init step counts [MAX+1], indexed by n.

        Built on first use per dtype/device; call once before capturing CUDA graphs.
        """
        key = (dtype, device)
        if key not in self._tables:
            t_tab = torch.zeros(MAX_TIMESTEPS + 1, MAX_TIMESTEPS, dtype=dtype)
            dt_tab = torch.zeros(MAX_TIMESTEPS + 1, MAX_TIMESTEPS, dtype=dtype)
            zeros = torch.zeros(MAX_TIMESTEPS + 1, dtype=torch.long)
            for n in range(1, MAX_TIMESTEPS + 1):
                t_tab[n, :n], dt_tab[n, :n] = euler_schedule(n, dtype)
                zeros[n] = zero_init_steps(n)
            self._tables[key] = (t_tab.to(device), dt_tab.to(device), zeros.to(device))
        return self._tables[key]

    def forward(
        self,
        mu: torch.Tensor,
        cond: torch.Tensor,
        noise: torch.Tensor,
        temperature: torch.Tensor,
        cfg_value: torch.Tensor,
        timesteps: torch.Tensor,
        max_timesteps: int,
    ) -> torch.Tensor:
        """mu [B, mu_dim], cond [B, P, D], noise [B, P, D] fp32, per-row temperature/cfg_value [B] and
        timesteps [B] (each <= max_timesteps) -> latent patch [B, P, D] in the model dtype."""
        dtype = mu.dtype
        t_tab, dt_tab, zero_tab = self.schedule_tables(dtype, mu.device)
        n = timesteps.clamp(1, MAX_TIMESTEPS)
        t_rows, dt_rows, zero_rows = t_tab[n], dt_tab[n], zero_tab[n]
        x = (noise.float() * temperature.float()[:, None, None]).to(dtype)
        cfg = cfg_value.float()[:, None, None]
        mu2, cond_tokens = self.estimator.context(mu, cond)
        batch = x.shape[0]
        if not self.mean_mode:  # dt is an input only in mean mode; otherwise its token is constant (dt = 0)
            delta = self.estimator.delta_token(torch.zeros(1, dtype=dtype, device=mu.device))
        # Step 1 is a zero-velocity step for every row (CFG-Zero*), so it changes nothing and is skipped.
        for k in range(2, max_timesteps + 1):
            dt = dt_rows[:, k - 1]
            if self.mean_mode:
                delta = self.estimator.delta_token(dt)
            time = self.estimator.time_token(t_rows[:, k - 1]) + delta
            v_c, v_u = self.estimator(torch.cat((x, x)), time.repeat(2, 1), mu2, cond_tokens).split(batch)
            dot = (v_c * v_u).flatten(1).sum(dim=1)
            scale = (dot / ((v_u**2).flatten(1).sum(dim=1) + 1e-8)).view(batch, 1, 1)
            v = v_u * scale + (cfg * (v_c - v_u * scale)).to(dtype)
            v = torch.where((k <= zero_rows).view(batch, 1, 1), torch.zeros_like(v), v)
            x = x - dt.view(batch, 1, 1) * v
        return x
