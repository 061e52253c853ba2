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


class Fp8Linear(nn.Linear):
    """A loaded nn.Linear with its weight in FP8 (e4m3, one scale per output feature): the H100's FP8 tensor cores
    run its GEMM at about twice the bf16 rate. Inputs are quantised per row on the fly (kernels.fp8_linear), or
    arrive quantised (`forward_fp8`, from a kernel that fused it). Inference only; the parameters are the same
    names as the linear's, so LoRA sites and state-dict paths do not change."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = linear.weight.dtype  # what the activations are: the output's dtype
        weight, scale = kernels.quantize_rows_torch(linear.weight.detach())  # per output feature: exact anywhere
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.register_buffer("weight_scale", scale.t().contiguous(), persistent=False)  # [1, N]: _scaled_mm's
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.fp8_linear(x, self.weight, self.weight_scale, self.bias)

    def forward_fp8(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The product for rows already quantised: q [..., in] e4m3 with scale [..., 1]."""
        return kernels.fp8_matmul(q, scale, self.weight, self.weight_scale, self.bias, self.out_dtype)


def use_fp8_(module: nn.Module, names: tuple[str, ...]) -> None:
    """Replace every nn.Linear under `module` whose attribute name is in `names` by its Fp8Linear."""
    targets = [
        (parent, name)
        for parent in module.modules()
        for name, child in parent.named_children()
        if name in names and type(child) is nn.Linear
    ]
    for parent, name in targets:
        setattr(parent, name, Fp8Linear(getattr(parent, name)))
