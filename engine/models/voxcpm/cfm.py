"""The CFM sampler: Euler over a sway-scheduled t-span with classifier-free guidance and CFG-Zero*.

Reference: voxcpm `modules/locdit/unified_cfm.py` (`forward` + `solve_euler`). Per row of the batch it takes
its own cfg_value, temperature and number of Euler steps n. The solver is split so that a runtime can graph it:
`begin` builds the state (`FlowState`), `step` runs one Euler iteration k (a device scalar) over it in place, and
`solve` loops. Iteration k of a row with n < k has dt = 0 and leaves it unchanged, so rows with different n share
one batch, and rows ordered by n, most first, let iteration k run on a prefix of the batch only.

The schedule (t_k, dt_k) of every n is precomputed with the reference's exact arithmetic: t_span in the model
dtype, then t and dt carried by subtraction (t <- t - dt; dt <- t - t_span[k+1]) rather than read from t_span.
CFG-Zero*: the first max(1, int(0.04 * (n + 1))) iterations use zero velocity (no estimator call), and the
guided velocity is v_u * s + cfg * (v_c - v_u * s) with s = <v_c, v_u> / (|v_u|^2 + 1e-8).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine import kernels
from engine.lora.linear import AdapterRows
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


@dataclass(slots=True)
class FlowState:
    """The solver's state of B rows between Euler iterations. Rows are independent, so the rows that still
    have iterations to run can be a prefix (`rows(m)`): the runner orders rows by n, most first."""

    x: torch.Tensor  # [B, P, D] model dtype: the sample, updated in place by each iteration
    mu: torch.Tensor  # [B, mu_dim] model dtype: the LM conditioning
    cond: torch.Tensor  # [B, P, D] model dtype: the previous patch
    steps: torch.Tensor  # int64 [B]: the row's Euler step count n
    cfg: torch.Tensor  # float32 [B]: the row's classifier-free guidance value
    adapter: torch.Tensor  # int32 [B]: the row's LoRA slot (0: none)
    delta: torch.Tensor  # [B, hidden] model dtype: the dt token of every iteration (outside mean mode: dt = 0)

    @classmethod
    def empty(
        cls,
        rows: int,
        mu_dim: int,
        hidden: int,
        patch_size: int,
        feat_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> FlowState:
        """Zeroed buffers of `rows` rows with one Euler step each (inert: every iteration has dt = 0)."""
        latent = (rows, patch_size, feat_dim)
        return cls(
            x=torch.zeros(latent, dtype=dtype, device=device),
            mu=torch.zeros(rows, mu_dim, dtype=dtype, device=device),
            cond=torch.zeros(latent, dtype=dtype, device=device),
            steps=torch.ones(rows, dtype=torch.int64, device=device),
            cfg=torch.zeros(rows, device=device),
            adapter=torch.zeros(rows, dtype=torch.int32, device=device),
            delta=torch.zeros(rows, hidden, dtype=dtype, device=device),
        )

    def rows(self, m: int) -> FlowState:
        """Views of the first m rows."""
        return FlowState(*(getattr(self, name)[:m] for name in self.__slots__))

    def copy_(self, other: FlowState) -> None:
        """Write `other` (as many rows as this state) into this state's buffers."""
        for name in self.__slots__:
            getattr(self, name).copy_(getattr(other, name))


class CFM(nn.Module):
    def __init__(self, estimator: LocDiT, mean_mode: bool) -> None:
        super().__init__()
        self.estimator = estimator
        self.mean_mode = mean_mode
        self.adapter_rows: AdapterRows | None = None  # the model's, when adapters are attached
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

    def begin(
        self,
        mu: torch.Tensor,
        cond: torch.Tensor,
        noise: torch.Tensor,
        temperature: torch.Tensor,
        cfg_value: torch.Tensor,
        timesteps: torch.Tensor,
        adapter: torch.Tensor | None = None,
    ) -> FlowState:
        """The solver's start for B rows: mu [B, mu_dim], cond [B, P, D] (model dtype), noise [B, P, D] fp32,
        per-row temperature/cfg_value [B], timesteps [B] (Euler steps n, clamped to 1..MAX_TIMESTEPS) and LoRA
        slots [B] (None: none)."""
        x = (noise.float() * temperature.float()[:, None, None]).to(mu.dtype)
        if adapter is None:
            adapter = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
        steps = timesteps.clamp(1, MAX_TIMESTEPS)
        # Outside mean mode the dt token is that of dt = 0 for every row and iteration: computed once per patch
        # here rather than in each iteration (in mean mode `step` computes it from dt and this is unread).
        delta = self.estimator.delta_token(torch.zeros(1, dtype=mu.dtype, device=mu.device)).expand(x.shape[0], -1)
        return FlowState(x=x, mu=mu, cond=cond, steps=steps, cfg=cfg_value.float(), adapter=adapter.int(), delta=delta)

    def step(self, state: FlowState, k: torch.Tensor) -> None:
        """Euler iteration k (int64 0-dim tensor on the device, 2 <= k <= MAX_TIMESTEPS) of every row of
        `state`, in place on `state.x`. A row with n < k has dt = 0 there and stays unchanged. k lives on the
        device so that one captured iteration replays for any k (the runner's graphs)."""
        x = state.x
        dtype, batch = x.dtype, x.shape[0]
        t_tab, dt_tab, zero_tab = self.schedule_tables(dtype, x.device)
        # A 0-dim index would be read back to the host (a sync, not capturable): index with a [B] tensor instead.
        column = (k - 1).expand(batch)
        t, dt = t_tab[state.steps, column], dt_tab[state.steps, column]
        time = self.estimator.time_token(t) + (self.estimator.delta_token(dt) if self.mean_mode else state.delta)
        if self.adapter_rows is not None:  # the CFG batch: both halves of a row use its adapter
            self.adapter_rows.dit = torch.cat((state.adapter, state.adapter))
        mu2, cond_tokens = self.estimator.context(state.mu, state.cond)
        v_c, v_u = self.estimator(torch.cat((x, x)), time.repeat(2, 1), mu2, cond_tokens).split(batch)
        kernels.guided_euler_(x, v_c, v_u, state.cfg, dt, k <= zero_tab[state.steps])

    def solve(self, state: FlowState, max_timesteps: int) -> torch.Tensor:
        """Every Euler iteration of every row (max_timesteps >= each row's n) -> the latent patch [B, P, D]."""
        # Step 1 is a zero-velocity step for every row (CFG-Zero*), so it changes nothing and is skipped.
        k = torch.full((), 2, dtype=torch.int64, device=state.x.device)
        for _ in range(2, max_timesteps + 1):
            self.step(state, k)
            k += 1
        return state.x

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
        """`begin` then `solve`: latent patch [B, P, D] in the model dtype."""
        return self.solve(self.begin(mu, cond, noise, temperature, cfg_value, timesteps), max_timesteps)
