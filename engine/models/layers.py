"""Layers that more than one model family uses as they are."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine import kernels


@dataclass(frozen=True, slots=True)
class Fp8Rows:
    """Activations already quantised per row for an Fp8Linear by the kernel that made them (an RMSNorm): q [..., K]
    e4m3, scale [..., 1] fp32. Saves the GEMM's input a model-dtype round trip through memory and a pass."""

    q: torch.Tensor
    scale: torch.Tensor
    # The model-dtype rows they quantise, for a reader that needs those too (a LoRA adapter beside the FP8 GEMM).
    source: torch.Tensor | None = None


class RMSNorm(nn.Module):
    """RMSNorm as MiniCPM4 and Qwen3 define it: normalise in fp32, round to the input dtype, then scale.

    With `fp8`, the output is the same rows quantised for an Fp8Linear (`Fp8Rows`), in the same kernel."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, fp8: bool = False) -> torch.Tensor | Fp8Rows:
        if fp8:
            return Fp8Rows(*kernels.rms_norm_fp8(x, self.weight, self.eps))
        return kernels.rms_norm(x, self.weight, self.eps)

    def add_forward(
        self, x: torch.Tensor, update: torch.Tensor, fp8: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows]:
        """(x + update, norm(x + update)) in one pass."""
        if fp8:
            summed, q, scale = kernels.add_rms_norm_fp8(x, update, self.weight, self.eps)
            return summed, Fp8Rows(q, scale)
        return kernels.add_rms_norm(x, update, self.weight, self.eps)


# Below this many input rows an Fp8Linear multiplies in the model dtype: at one VoxCPM2 stream (22 LocDiT rows, 2
# guidance rows of 11 positions) the quantising launches cost more than the FP8 GEMM saves (RTF 0.065 against 0.059
# on the H100, FP8 throughout), and at batch FP8 wins (xRT +16 % at 256 and 512 streams). Read at call time, so that
# tests can move it.
FP8_MIN_ROWS = 512


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fp8: Fp8Weight | None) -> torch.Tensor:
    """kernels.linear, or its FP8 product (kernels.fp8_linear) when `fp8` is given and multiplies x's rows."""
    if fp8 is not None and fp8.multiplies(x.numel() // x.shape[-1]):
        return kernels.fp8_linear(x, fp8.weight, fp8.scale, bias)
    return kernels.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear through kernels.linear: a few rows on the GPU stream the weight through a Triton kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.weight, self.bias)


class Fp8Weight(nn.Module):
    """A weight [N, K] in e4m3 with one fp32 scale per output feature ([1, N], as torch._scaled_mm takes it), used
    for inputs of `min_rows` rows or more (None: FP8_MIN_ROWS)."""

    def __init__(self, weight: torch.Tensor, min_rows: int | None = None) -> None:
        super().__init__()
        q, scale = kernels.quantize_rows_torch(weight.detach())  # the twin: exact on any device
        self.register_buffer("weight", q, persistent=False)
        self.register_buffer("scale", scale.t().contiguous(), persistent=False)
        self.min_rows = min_rows

    def multiplies(self, rows: int) -> bool:
        """Whether a product of `rows` input rows runs in FP8."""
        return rows >= (FP8_MIN_ROWS if self.min_rows is None else self.min_rows)


class Fp8BlockWeight(nn.Module):
    """A weight [N, K] in e4m3 with one fp32 scale per 128x128 block ([N / 128, K / 128]: kernels.FP8_BLOCK)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        q, scale = kernels.quantize_blocks_torch(weight.detach())
        self.register_buffer("weight", q, persistent=False)
        self.register_buffer("scale", scale, persistent=False)

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        """Whole blocks, and K / 128 blocks a multiple of kernels.BLOCK_MLP_K_BLOCKS (cuBLAS's scale layout)."""
        out_features, in_features = weight.shape
        blocks = kernels.FP8_BLOCK
        return out_features % blocks == 0 and in_features % (blocks * kernels.BLOCK_MLP_K_BLOCKS) == 0


class Fp8Linear(nn.Linear):
    """A loaded nn.Linear that also holds its weight in FP8 (`fp8`) and multiplies in FP8 at batch (`linear`): the
    H100's FP8 tensor cores run about twice the bf16 rate. Inputs are quantised per row on the fly, or arrive
    quantised (`forward_fp8`, from a kernel that fused it). The model-dtype weight stays (small batches use it;
    LoRA sites, state-dict paths and dtypes do not change). Inference only."""

    def __init__(self, base: nn.Linear, blocks: bool = False, min_rows: int | None = None) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.fp8 = Fp8Weight(base.weight, min_rows)
        # With `blocks` (and both dims multiples of 128), also in 128x128 blocks: for inputs that arrive quantised per
        # 1x128 block (forward_fp8_blocks, from kernels.gate_up_silu_fp8).
        self.fp8_blocks = Fp8BlockWeight(base.weight) if blocks and Fp8BlockWeight.fits(base.weight) else None

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        if isinstance(x, Fp8Rows):
            return self.forward_fp8(x.q, x.scale)
        return linear(x, self.weight, self.bias, self.fp8)

    def takes_fp8(self, x: torch.Tensor) -> bool:
        """Whether an input like x runs in FP8: a caller that can quantise it in a fused kernel then does."""
        return self.fp8.multiplies(x.numel() // x.shape[-1])

    def forward_fp8(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The product for rows already quantised: q [..., in] e4m3 with scale [..., 1]."""
        return kernels.fp8_matmul(q, scale, self.fp8.weight, self.fp8.scale, self.bias, self.weight.dtype)


def takes_fp8(consumer: nn.Module | None, x: torch.Tensor) -> bool:
    """Whether `consumer` is an Fp8Linear (not wrapped, e.g. by LoRA, whose adapter needs x itself) that multiplies
    rows like x in FP8: their producer then hands it `Fp8Rows`."""
    return type(consumer) is Fp8Linear and consumer.takes_fp8(x)


def takes_fp8_rows(consumer: nn.Module | None, rows: int) -> bool:
    """takes_fp8 for `rows` input rows, before they exist (the kernel that makes them quantises them)."""
    return type(consumer) is Fp8Linear and multiplies_fp8(consumer, rows)


def multiplies_fp8(consumer: nn.Module | None, rows: int) -> bool:
    """Whether `consumer`'s GEMM runs in FP8 for `rows` input rows, wrapped or not (a LoRA linear over an Fp8Linear
    keeps its FP8 weight as `fp8` too)."""
    fp8 = getattr(consumer, "fp8", None)
    return fp8 is not None and fp8.multiplies(rows)


def unwrapped(module: nn.Module) -> bool:
    """Whether `module` is a Linear or an Fp8Linear as loaded: its product is x @ weight.T alone (no adapter), so a
    kernel that fuses something into the GEMM may compute it from the weight."""
    return type(module) in (Linear, Fp8Linear)


def takes_fp8_blocks(consumer: nn.Module) -> bool:
    """Whether `consumer` is an Fp8Linear (not wrapped) that also holds its weight in 128x128 blocks."""
    return type(consumer) is Fp8Linear and consumer.fp8_blocks is not None


def use_fp8_(
    module: nn.Module, names: tuple[str, ...], blocks: tuple[str, ...] = (), min_rows: int | None = None
) -> None:
    """Replace every nn.Linear under `module` whose attribute name is in `names` by its Fp8Linear (FP8 from
    `min_rows` input rows), with 128x128 block-scaled weights too where the name is in `blocks`."""
    targets = [
        (parent, name)
        for parent in module.modules()
        for name, child in parent.named_children()
        if name in names and type(child) in (nn.Linear, Linear)
    ]
    for parent, name in targets:
        setattr(parent, name, Fp8Linear(getattr(parent, name), blocks=name in blocks, min_rows=min_rows))
