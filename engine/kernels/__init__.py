"""Fused kernels (Triton, CUDA only) and their plain-torch twins, behind one dispatch per op.

Why: at batch, a LocDiT layer is ~40 kernel launches of which only 4 are GEMMs; the rest (fp32 RMSNorm, RoPE,
SiLU*mul, residual adds) each make a full pass over [2 * B * S, hidden] activations, and the VAE's Snake makes
five passes over its largest tensors. Each fused kernel does one pass and keeps the twin's rounding points
(fp32 math, one rounding to the model dtype where the twin rounds), so outputs agree with the twin to the last
bf16 ulp or so (tests/engine/kernels compare them on the GPU).

Two more replace library kernels that the profile showed are badly matched to our shapes (H200, B=256 step):
- `dense_attention`: LocDiT/LocEnc rows are 5-11 tokens; flash-attn's 128x128 tiles spent 18 ms of a 97 ms
  step on them. The Triton kernel holds one row's keys in one 16-wide tile.
- `causal_conv_snake`: the VAE's depthwise dilated conv reads its causal context in place (no `cat`) and
  applies the following Snake in its epilogue; PyTorch's generic depthwise kernel plus the `cat` and the
  separate Snake took ~17 ms.

`causal_conv_transpose` keeps cuDNN's transposed conv but runs it on the block's input alone, adding the carried
frame's part of the first samples afterwards (a small GEMM): concatenating the frame copied each VAE block's input
(~2 ms of a B=512 VoxCPM2 step on an H100).
The passes that finish a VAE tensor (the upsampling's bias, a residual unit's bias + residual) apply the next Snake
too (`pointwise_residual_snake`, `causal_conv_transpose_snake`): the Snake no longer reads that tensor once more.

Qwen3-TTS adds four (the code predictor's 15 passes a frame were bound by kernel count, its codec decoder by
elementwise passes): `qk_norm_rope`, `cached_attention`, `snake_beta` and `counter_uniform` (engine.noise's hash).

FP8 (opt-in, `EngineConfig.fp8_gemms`): `quantize_rows` and `silu_mul_fp8` write the per-row scaled e4m3 inputs that
`fp8_linear`'s GEMM (torch._scaled_mm, rowwise scales) reads; the SiLU*mul one saves the down projection's input a
bf16 round trip through memory, and `rope_attention` (RoPE, a local stack's attention and its kept positions in one
kernel) writes o_proj's rows scaled by a bound it knows before the output exists (`bounded_fp8_rows_torch`).
`fp8_block_mlp` goes further for an MLP whose down projection holds 128x128 block-scaled weights: the gate/up GEMM
itself applies SiLU*mul and quantises per 1x128 block in its epilogue, so neither the gate/up output nor a SiLU*mul
pass goes through memory, and cuBLAS's block-scaled GEMM reads its output (LocDiT MLP at B=512 on an H200: 0.300 ms a
call against 0.317 for the three kernels before).

The twins are the reference numerics (voxcpm `modules/minicpm4/model.py`, `audio_vae*.py`; qwen-tts 0.1.1) and are
what CPU runs and parity tests execute. `fused_enabled(False)` forces the twins on CUDA too (profiling, A/B checks).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

_TRITON = importlib.util.find_spec("triton") is not None
# dense_attention's fused kernel holds a row's keys in one tile of at most this many positions (16 is tl.dot's
# smallest); the released local stacks have 5-11. Longer rows take the twin.
MAX_TINY_SEQ = 32
# `linear` and `gate_up_silu` stream the weight through a Triton kernel for at most this many rows (one stream's
# step: the LMs' 1 row, the LocDiT's 22), where cuBLAS's kernels were slower at seven of eight shapes; at 64 rows
# each won four (an H200, benchmarks/results/h200-2026-11-29b).
FEW_ROWS = 32
_enabled = True  # owned here; flipped only through fused_enabled()


@contextlib.contextmanager
def fused_enabled(enabled: bool) -> Iterator[None]:
    """Temporarily turn the Triton kernels on or off (they are on by default wherever they can run)."""
    global _enabled
    previous, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = previous


def _fused(x: torch.Tensor) -> bool:
    return _enabled and _TRITON and x.is_cuda


# -- twins -------------------------------------------------------------------------------------------------------


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32, round to x's dtype, then multiply by the weight (the reference's order)."""
    variance = x.float().pow(2).mean(dim=-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, D]; cos/sin [..., 1, D]. Computed in fp32 and rounded back, like the reference."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448: a row's largest magnitude maps here
FP8_MIN_AMAX = 1e-12  # an all-zero row gets this amax, not a zero scale


def quantize_rows_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], fp32 scale [M, 1]) with x ≈ q * scale: each row scaled so its largest magnitude
    is FP8_MAX (dynamic, per token for activations and per output feature for weights), rounded to nearest."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=FP8_MIN_AMAX) / FP8_MAX
    return (xf / scale).to(FP8), scale


def _quantize_last_dim(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows_torch over y's last dim, keeping its leading dims on the e4m3 rows and the scales."""
    q, scale = quantize_rows_torch(y.reshape(-1, y.shape[-1]))
    return q.view(y.shape), scale.view(*y.shape[:-1], 1)


def silu_mul_fp8_torch(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """silu_mul (rounded to the model dtype, as the bf16 path feeds the down projection) then quantize_rows; the
    leading dims of gate_up are kept on the e4m3 rows and the scales."""
    return _quantize_last_dim(silu_mul_torch(gate_up))


def rms_norm_fp8_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_torch (rounded to x's dtype, as the model-dtype path feeds the next GEMM) then quantize_rows."""
    return _quantize_last_dim(rms_norm_torch(x, weight, eps))


FP8_BLOCK = 128  # block-scaled FP8: one scale per 1x128 of an activation row and per 128x128 of a weight
# cuBLAS's block-scaled GEMM refuses a row count that is not a multiple of this (CUBLAS_STATUS_NOT_SUPPORTED on an
# H200 at 530 rows) and a weight whose K / 128 blocks are not a multiple of 4 (its scales' layout pads them).
BLOCK_MLP_ROWS = 16
BLOCK_MLP_K_BLOCKS = 4
_ROUNDED = (torch.bfloat16, torch.float16, torch.float32)  # the model dtypes the fused gate/up kernel rounds to


def quantize_blocks_torch(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (both multiples of FP8_BLOCK) -> (e4m3 [N, K], fp32 scale [N / 128, K / 128]): each 128x128
    block scaled so that its largest magnitude is FP8_MAX, rounded to nearest."""
    n, k = weight.shape
    blocks = weight.float().view(n // FP8_BLOCK, FP8_BLOCK, k // FP8_BLOCK, FP8_BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=FP8_MIN_AMAX) / FP8_MAX
    return (blocks / scale[:, None, :, None]).to(FP8).view(n, k), scale


def gate_up_silu_fp8_torch(
    q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate/up GEMM (scaled_mm_torch: q [M, K] e4m3 with scale [M, 1], weight [2N, K] e4m3, gate rows then up
    rows, with weight_scale [1, 2N]) rounded to `dtype`, SiLU*mul as silu_mul_torch rounds it, then each row
    quantised per FP8_BLOCK columns: (e4m3 [M, N], fp32 scale [M, N / 128])."""
    h = silu_mul_torch(scaled_mm_torch(q, scale, weight, weight_scale, dtype))
    blocks = h.float().view(h.shape[0], -1, FP8_BLOCK)
    block_scale = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=FP8_MIN_AMAX) / FP8_MAX
    return (blocks / block_scale).to(FP8).view(h.shape), block_scale.squeeze(-1)


def block_scaled_mm_torch(
    q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """What the down GEMM of fp8_block_mlp computes, in fp32 from the dequantised operands: q [M, K] e4m3 with
    1x128 scales [M, K / 128] times weight [N, K] e4m3 with 128x128 scales [N / 128, K / 128] -> [M, N] in
    `dtype`."""
    a = q.float() * scale.repeat_interleave(FP8_BLOCK, dim=1)
    w = weight.float() * weight_scale.repeat_interleave(FP8_BLOCK, dim=0).repeat_interleave(FP8_BLOCK, dim=1)
    return (a @ w.t()).to(dtype)


def scaled_mm_torch(
    q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """What fp8_linear's GEMM computes, in fp32 from the dequantised operands: q [M, K] e4m3 with scale [M, 1],
    weight [N, K] e4m3 with weight_scale [1, N] -> [M, N] in `dtype` (the reference for the GPU's _scaled_mm)."""
    return ((q.float() @ weight.float().t()) * scale * weight_scale).to(dtype)


def snake_torch(
    x: torch.Tensor, alpha: torch.Tensor, affine: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """x + sin²(αx)/α with the reference's 1e-9 guard; x [B, C, L], alpha [1, C, 1]. With `affine` = (scale,
    shift), each [1, C, 1], the Snake of x * scale + shift (the VAE's sample-rate conditioning before a block)."""
    if affine is not None:
        x = x * affine[0] + affine[1]
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


def snake_beta_torch(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> torch.Tensor:
    """SnakeBeta (the Qwen3-TTS codec's activation): x + sin²(x·e^a) / (e^b + 1e-9) with per-channel logs a, b [C]
    (fp32), x [B, C, L]. Computed in fp32 and rounded once to x's dtype, so a 16-bit x costs one rounding; for an
    fp32 x these are exactly the reference's ops."""
    alpha = torch.exp(log_alpha)[None, :, None]
    beta = torch.exp(log_beta)[None, :, None]
    xf = x.float()
    return (xf + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(xf * alpha), 2)).to(x.dtype)


def qk_norm_rope_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's per-head q/k RMSNorm, then RoPE: q [..., H, D], k [..., Hkv, D], cos/sin [R, 1, D]."""
    return (
        rope_torch(rms_norm_torch(q, q_weight, eps), cos, sin),
        rope_torch(rms_norm_torch(k, k_weight, eps), cos, sin),
    )


def cached_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of B rows in lockstep over a dense per-row cache (the Qwen3-TTS code predictor's): q [B, S, H,
    D] at positions start..start+S-1, k/v [B, S, Hkv, D] written into k_cache/v_cache [B, max, Hkv, D] there
    (cast in the copy), then read causally. Scores, softmax and the weighted sum in fp32; out [B, S, H * D] in q's
    dtype."""
    batch, len_q, heads, dim = q.shape
    kv_heads = k.shape[2]
    end = start + len_q
    k_cache[:, start:end] = k
    v_cache[:, start:end] = v
    qg = q.float().reshape(batch, len_q, kv_heads, heads // kv_heads, dim)
    keys, values = k_cache[:, :end].float(), v_cache[:, :end].float()
    scores = torch.einsum("bqhgd,bkhd->bhgqk", qg, keys) * scale
    if len_q > 1:
        q_pos = torch.arange(start, end, device=q.device)
        causal = torch.arange(end, device=q.device)[None, :] <= q_pos[:, None]
        scores = scores.masked_fill(~causal, float("-inf"))
    out = torch.einsum("bhgqk,bkhd->bqhgd", scores.softmax(dim=-1), values)
    return out.reshape(batch, len_q, heads * dim).to(q.dtype)


def dense_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Bidirectional attention within each row: q [B, S, H, D], k/v [B, S, Hkv, D] -> [B, S, H, D]."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2)


def rope_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: float,
    keep: int,
    fp8: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A local stack's attention as its o_proj reads it: rope_torch on q [B, S, H, D] and k [B, S, Hkv, D] (cos/sin
    [S, 1, D]), dense_attention_torch with v, each row's last `keep` positions as [B, keep, H * D] in q's dtype; with
    `fp8`, those quantised by bounded_fp8_rows_torch."""
    out = dense_attention_torch(rope_torch(q, cos, sin), rope_torch(k, cos, sin), v, scale)[:, -keep:]
    out = out.reshape(*out.shape[:2], -1)
    return bounded_fp8_rows_torch(out, v) if fp8 else out


def bounded_fp8_rows_torch(out: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output out [B, keep, F] as e4m3 rows for an Fp8Linear, each row b's positions sharing one scale
    from its values v [B, S, Hkv, D]: every output is a convex combination of the row's values, so max |v| bounds
    them all (the few ulps that P's rounding adds are clamped off). Unlike the output's own amax (quantize_rows) the
    bound is known before the output is, so the kernel that makes the output writes it as e4m3 at once. e4m3 keeps
    its three mantissa bits down to 2^-15 of the bound; below that the looser scale loses precision, where the
    values are too small to matter. -> (e4m3 [B, keep, F], fp32 scale [B, keep, 1])."""
    bound = v.float().abs().amax(dim=(1, 2, 3))
    row_scale = (bound.clamp(min=FP8_MIN_AMAX) * (1 / FP8_MAX))[:, None, None]
    q = (out.float() * (1 / row_scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)  # one division a row, as the kernel
    return q, row_scale.expand(*out.shape[:2], 1).contiguous()


def causal_conv_torch(
    x: torch.Tensor, context: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int
) -> torch.Tensor:
    """conv1d(cat(context, x)): a causal conv whose left context [B, C, (K-1)*dilation] comes from the caller (zeros
    offline, the previous call's frames when streaming). x [B, C, L]; weight [Cout, C/groups, K]."""
    groups = x.shape[1] // weight.shape[1]
    return F.conv1d(torch.cat((context, x), dim=-1), weight, bias, dilation=dilation, groups=groups)


def causal_conv_snake_torch(
    x: torch.Tensor,
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    alpha: torch.Tensor,
) -> torch.Tensor:
    """snake(causal_conv_torch(...)): the VAE's dilated conv and the Snake after it."""
    return snake_torch(causal_conv_torch(x, context, weight, bias, dilation), alpha)


def pointwise_residual_torch(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor
) -> torch.Tensor:
    """residual + conv1d(h, weight, bias) for a pointwise conv (weight [Cout, Cin, 1]): a VAE residual unit's end."""
    return residual + F.conv1d(h, weight, bias)


# The next layer's Snake, which the pass before it applies: (alpha, channel affine), as snake() takes them.
NextSnake = tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]


def pointwise_residual_snake_torch(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    alpha: torch.Tensor,
    affine: tuple[torch.Tensor, torch.Tensor] | None = None,
    keep: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(y, snake_torch(y, alpha, affine)) for y = pointwise_residual_torch(...): a residual unit's end and the next
    layer's Snake of it; y is None unless `keep` (the next layer reads only the Snake's output)."""
    y = pointwise_residual_torch(h, weight, bias, residual)
    return (y if keep else None), snake_torch(y, alpha, affine)


def conv_transpose_crop_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int, left: int, right: int
) -> torch.Tensor:
    """conv_transpose1d(x, weight, bias, stride) without its first `left` and last `right` output samples."""
    y = F.conv_transpose1d(x, weight, bias, stride)
    return y[..., left : y.shape[-1] - right]


def causal_conv_transpose_torch(
    x: torch.Tensor, context: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int
) -> torch.Tensor:
    """The streaming VAE's upsampling conv (weight [Cin, Cout, 2 * stride]) over [context | x], context [B, Cin, 1]
    the previous call's last frame: the `stride` samples of each frame of x, [B, Cout, L * stride]."""
    return conv_transpose_crop_torch(torch.cat((context, x), dim=-1), weight, bias, stride, stride, stride)


def causal_conv_transpose_snake_torch(
    x: torch.Tensor,
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int,
    alpha: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, snake_torch(y, alpha)) for y = causal_conv_transpose_torch(...): a VAE block's upsampling and its first
    residual unit's first Snake."""
    y = causal_conv_transpose_torch(x, context, weight, bias, stride)
    return y, snake_torch(y, alpha)


def guided_euler_torch_(
    x: torch.Tensor, v_c: torch.Tensor, v_u: torch.Tensor, cfg: torch.Tensor, dt: torch.Tensor, frozen: torch.Tensor
) -> None:
    """x -= dt * v in place, v the CFG-Zero* guided velocity of the conditional and unconditional ones:
    v_u * s + cfg * (v_c - v_u * s), s = <v_c, v_u> / (|v_u|^2 + 1e-8) per row; v = 0 on `frozen` rows.
    x, v_c, v_u [B, P, D] model dtype; cfg [B] float32; dt [B] model dtype; frozen bool [B]."""
    batch, dtype = x.shape[0], x.dtype
    dot = (v_c * v_u).flatten(1).sum(dim=1)
    scale = (dot / ((v_u**2).flatten(1).sum(dim=1) + 1e-8)).view(batch, 1, 1)
    v = v_u * scale + (cfg[:, None, None] * (v_c - v_u * scale)).to(dtype)
    v = torch.where(frozen.view(batch, 1, 1), torch.zeros_like(v), v)
    x.sub_(dt.view(batch, 1, 1) * v)


@dataclass(frozen=True, slots=True)
class LoRARows:
    """The adapter slot of each row of one row layout, made once (`lora_rows`) for every linear that reads it.

    On CUDA it also holds the rows grouped by slot, which the segmented kernels walk: `order` lists the rows of
    slots 1..S-1 slot by slot (stable; slot-0 rows are left out, the tail past them is unused) and slot s's rows
    are order[segments[s]:segments[s + 1]]. Fixed shapes whatever the slots, so CUDA graphs capture it."""

    index: torch.Tensor  # int32 [M], slot per row (0 = no adapter)
    order: torch.Tensor | None = None  # int32 [M]
    segments: torch.Tensor | None = None  # int32 [S + 1]


def lora_add_torch(y: torch.Tensor, x: torch.Tensor, index: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """y[m] += (x[m] @ a[s].T) @ b[s] with s = index[m], in place: each row's own adapter slot's low-rank update.

    y [M, out], x [M, in], index int [M], a [S, R, in], b [S, R, out] (the adapter's B transposed, its scaling
    folded in). Fixed shapes whatever the slots (capturable): every slot's shrink is computed for every row and
    the columns of the other slots are zeroed, which costs S*R columns instead of R; slot 0 (no adapter) is all
    zeros, so its rows get exactly + 0. The intermediate is rounded to x's dtype, as the reference's two
    F.linear calls round it."""
    slots, rank, _ = a.shape
    shrunk = x @ a.reshape(slots * rank, -1).t()  # [M, S*R]
    owner = torch.arange(slots, device=x.device).repeat_interleave(rank)
    shrunk = torch.where(index[:, None] == owner[None, :], shrunk, torch.zeros_like(shrunk))
    y += shrunk @ b.reshape(slots * rank, -1)


# -- dispatch ----------------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.rms_norm(x, weight, eps)
    return rms_norm_torch(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + update, rms_norm(x + update)): the residual add and the next layer norm in one pass."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.add_rms_norm(x, update, weight, eps)
    summed = x + update
    return summed, rms_norm_torch(summed, weight, eps)


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """See rms_norm_fp8_torch: the e4m3 rows and scales an Fp8Linear reads, without the normed rows' round trip."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.rms_norm_fp8(x, weight, eps)
    return rms_norm_fp8_torch(x, weight, eps)


def add_rms_norm_fp8(
    x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x + update, then rms_norm_fp8 of it as (e4m3 rows, scales)) in one pass."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.add_rms_norm_fp8(x, update, weight, eps)
    summed = x + update
    return summed, *rms_norm_fp8_torch(summed, weight, eps)


def rope_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q [..., H, D] and k [..., Hkv, D]; cos/sin [R, 1, D] with R = tokens (causal) or S (per row).

    The fused kernel rotates q and k in place inside their (strided) qkv buffer, one launch for both.
    """
    if _fused(q):
        from engine.kernels import triton_ops

        return triton_ops.rope_qk_(q, k, cos, sin)
    return rope_torch(q, cos, sin), rope_torch(k, cos, sin)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See qk_norm_rope_torch. The fused kernel normalises and rotates q and k in place inside their (strided) qkv
    buffer, one launch for what the twin does in ~20 (two norms, two rotations in fp32)."""
    if _fused(q):
        from engine.kernels import triton_ops

        return triton_ops.qk_norm_rope_(q, k, q_weight, k_weight, eps, cos, sin)
    return qk_norm_rope_torch(q, k, q_weight, k_weight, eps, cos, sin)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear; on the GPU, x of at most FEW_ROWS rows (and no bias) streams the weight through a Triton kernel."""
    if bias is None and _fused(x):
        from engine.kernels import triton_ops

        if triton_ops.few_rows_fit(x, weight, gated=False):
            return triton_ops.few_rows_linear(x, weight)
    return F.linear(x, weight, bias)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu_mul(F.linear(x, weight)) for weight [2N, K] (gate rows, then up rows); for a few rows on the GPU one
    kernel, with the same roundings, so that neither the gate/up product nor a SiLU*mul pass goes through memory."""
    if _fused(x):
        from engine.kernels import triton_ops

        if triton_ops.few_rows_fit(x, weight, gated=True):
            return triton_ops.few_rows_linear(x, weight, gated=True)
    return silu_mul(F.linear(x, weight))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if _fused(gate_up):
        from engine.kernels import triton_ops

        return triton_ops.silu_mul(gate_up)
    return silu_mul_torch(gate_up)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See quantize_rows_torch (x [M, K] contiguous)."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.quantize_rows(x)
    return quantize_rows_torch(x)


def silu_mul_fp8(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See silu_mul_fp8_torch: one pass from the gate/up GEMM's output to the down GEMM's e4m3 input."""
    if _fused(gate_up):
        from engine.kernels import triton_ops

        return triton_ops.silu_mul_fp8(gate_up)
    return silu_mul_fp8_torch(gate_up)


def fp8_block_mlp(
    q: torch.Tensor,
    scale: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """An MLP on e4m3 rows q [..., K] with scale [..., 1]: gate_up_silu_fp8_torch (gate_up [2N, K] with
    gate_up_scale [1, 2N]), then its block-scaled rows times down [H, N] with 128x128 scales down_scale
    [H / 128, N / 128] (block_scaled_mm_torch), plus bias: [..., H] in `dtype`. On the GPU the first is one Triton
    kernel and the second cuBLAS's block-scaled GEMM (torch._scaled_mm: its CPU kernel has rowwise scales only)."""
    lead, k = q.shape[:-1], q.shape[-1]
    rows, row_scale = q.reshape(-1, k), scale.reshape(-1, 1)
    fits = k % FP8_BLOCK == 0 and down.shape[1] % (FP8_BLOCK * BLOCK_MLP_K_BLOCKS) == 0
    if _fused(q) and fits and rows.is_contiguous() and gate_up.is_contiguous() and dtype in _ROUNDED:
        from engine.kernels import triton_ops

        # Rows padded to BLOCK_MLP_ROWS (zeros), both scale tensors column-major: what cuBLAS takes.
        h, h_scale = triton_ops.gate_up_silu_fp8(rows, row_scale, gate_up, gate_up_scale, dtype)
        y = torch._scaled_mm(h, down.t(), scale_a=h_scale, scale_b=down_scale.t(), out_dtype=dtype)[: rows.shape[0]]
    else:
        h, h_scale = gate_up_silu_fp8_torch(rows, row_scale, gate_up, gate_up_scale, dtype)
        y = block_scaled_mm_torch(h, h_scale, down, down_scale, dtype)
    if bias is not None:
        y = y + bias
    return y.view(*lead, down.shape[0])


def fp8_matmul(
    q: torch.Tensor,
    scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """q [..., K] e4m3 with per-row scale [..., 1] times weight [N, K] e4m3 with weight_scale [1, N], plus bias,
    in `dtype`: torch._scaled_mm with rowwise scales (the H100's FP8 tensor cores; fp32 accumulation)."""
    lead = q.shape[:-1]
    y = torch._scaled_mm(
        q.reshape(-1, q.shape[-1]),
        weight.t(),
        scale_a=scale.reshape(-1, 1),
        scale_b=weight_scale,
        bias=bias,
        out_dtype=dtype,
    )
    return y.view(*lead, weight.shape[0])


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """F.linear with an e4m3 weight (per-output-feature weight_scale [1, N]): x's rows are quantised on the fly."""
    q, scale = quantize_rows(x.reshape(-1, x.shape[-1]))
    return fp8_matmul(q.view(x.shape), scale, weight, weight_scale, bias, x.dtype)


def snake(
    x: torch.Tensor, alpha: torch.Tensor, affine: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """See snake_torch; the fused kernel applies `affine` as it loads x (no separate passes for it)."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.snake(x, alpha, affine)
    return snake_torch(x, alpha, affine)


def snake_beta(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> torch.Tensor:
    """See snake_beta_torch: one pass instead of the twin's ~8 (the codec's activations are its largest tensors)."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.snake_beta(x, log_alpha, log_beta)
    return snake_beta_torch(x, log_alpha, log_beta)


def pointwise_residual(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor
) -> torch.Tensor:
    """See pointwise_residual_torch. On CUDA PyTorch's cuDNN conv adds its bias in a pass of its own (a strided,
    broadcast elementwise kernel) before the residual add's pass; the fused path runs the conv without bias and
    adds bias and residual in one pass, with the same two roundings."""
    if _fused(h):
        from engine.kernels import triton_ops

        return triton_ops.pointwise_residual(h, weight, bias, residual)
    return pointwise_residual_torch(h, weight, bias, residual)


def pointwise_residual_snake(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    alpha: torch.Tensor,
    affine: tuple[torch.Tensor, torch.Tensor] | None = None,
    keep: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """See pointwise_residual_snake_torch. On CUDA the pass that adds bias and residual also writes the Snake of its
    result (of the rounded output, as a separate Snake would load it), instead of the Snake reading it once more."""
    if _fused(h):
        from engine.kernels import triton_ops

        return triton_ops.pointwise_residual_snake(h, weight, bias, residual, alpha, affine, keep)
    return pointwise_residual_snake_torch(h, weight, bias, residual, alpha, affine, keep)


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    scale: float,
) -> torch.Tensor:
    """See cached_attention_torch. The fused kernel (one program per row, KV head and query position) writes the
    new K/V, reads the cache and computes the attention in one launch instead of ~10 (cache copies, casts, two
    batched GEMMs of a few positions, softmax), 75 times a frame in the code predictor."""
    if _fused(q):
        from engine.kernels import triton_ops

        return triton_ops.cached_attention(q, k, v, k_cache, v_cache, start, scale)
    return cached_attention_torch(q, k, v, k_cache, v_cache, start, scale)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Bidirectional attention within each row of a local stack (see dense_attention_torch)."""
    if _fused(q):
        from engine.kernels import triton_ops

        return triton_ops.dense_attention(q, k, v, scale)
    return dense_attention_torch(q, k, v, scale)


def rope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor] | None,
    scale: float,
    keep: int,
    fp8: bool,
    dense: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor],
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A local stack's attention as its o_proj reads it (see rope_attention_torch; `rope` (cos, sin) or None). On the
    GPU one Triton kernel rotates q and k as it loads them and writes the kept positions' output, as e4m3 rows with
    `fp8`, where RoPE, the attention and quantising took three passes (on grids too small for it to pay, see
    triton_ops.rope_attention_pays, it runs for FP8 rows only). Elsewhere RoPE, then `dense` (the stack's attention
    backend), then bounded_fp8_rows_torch with `fp8`."""
    if rope is not None and _fused(q):
        from engine.kernels import triton_ops

        if triton_ops.rope_attention_fits(q, k, v, *rope) and (fp8 or triton_ops.rope_attention_pays(q, k)):
            return triton_ops.rope_attention(q, k, v, *rope, scale, keep, fp8)
    if rope is not None:
        q, k = rope_qk(q, k, *rope)
    out = dense(q, k, v, scale)[:, -keep:]
    out = out.reshape(*out.shape[:2], -1)
    return bounded_fp8_rows_torch(out, v) if fp8 else out


def conv_transpose_crop(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int, left: int, right: int
) -> torch.Tensor:
    """See conv_transpose_crop_torch. PyTorch's cuDNN transposed conv adds its bias in a strided broadcast pass
    over the whole output; the fused path adds it to the kept samples only, in place, in a pass of its own."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.conv_transpose_crop(x, weight, bias, stride, left, right)
    return conv_transpose_crop_torch(x, weight, bias, stride, left, right)


def causal_conv_transpose(
    x: torch.Tensor, context: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int
) -> torch.Tensor:
    """See causal_conv_transpose_torch; on CUDA without concatenating the context (see triton_ops)."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.causal_conv_transpose(x, context, weight, bias, stride)
    return causal_conv_transpose_torch(x, context, weight, bias, stride)


def guided_euler_(
    x: torch.Tensor, v_c: torch.Tensor, v_u: torch.Tensor, cfg: torch.Tensor, dt: torch.Tensor, frozen: torch.Tensor
) -> None:
    """See guided_euler_torch_: one launch per Euler iteration instead of ~15 small ones."""
    if _fused(x):
        from engine.kernels import triton_ops

        triton_ops.guided_euler_(x, v_c, v_u, cfg, dt, frozen)
        return
    guided_euler_torch_(x, v_c, v_u, cfg, dt, frozen)


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor, count: int) -> torch.Tensor:
    """engine.noise.uniform's float64 [B, count] (its twin is engine.noise.uniform_torch): the fused kernel hashes in
    uint32 arithmetic, which is exactly the twin's int64 arithmetic modulo 2**32, so the bits are the same."""
    if _fused(seeds):
        from engine.kernels import triton_ops

        return triton_ops.counter_uniform(seeds, steps, count)
    from engine.noise import uniform_torch

    return uniform_torch(seeds, steps, count)


def lora_rows(index: torch.Tensor, slots: int) -> LoRARows:
    """Prepare `index` (int32 [M], values in 0..slots-1) for lora_add_ calls; the grouping by slot is made only
    where the fused kernels will use it."""
    if _fused(index):
        from engine.kernels import triton_ops

        return triton_ops.lora_rows(index, slots)
    return LoRARows(index)


def lora_add_(y: torch.Tensor, x: torch.Tensor, rows: LoRARows, a: torch.Tensor, b: torch.Tensor) -> None:
    """See lora_add_torch. The fused kernels run one program per tile of rows of one slot (rows grouped by slot,
    see LoRARows), so each row is shrunk and expanded once, with its own slot's A and B; slot-0 rows are skipped."""
    if _fused(x):
        from engine.kernels import triton_ops

        triton_ops.lora_add_(y, x, rows, a, b)
        return
    lora_add_torch(y, x, rows.index, a, b)


def causal_conv(
    x: torch.Tensor, context: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int
) -> torch.Tensor:
    """See causal_conv_torch; fused for convs to a few output channels (the VAE's output conv, 32 channels to 1,
    where cuDNN took 0.8 ms at 512 streams for a 252 MB read, after the concatenation's copy)."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.causal_conv(x, context, weight, bias, dilation)
    return causal_conv_torch(x, context, weight, bias, dilation)


def causal_conv_snake(
    x: torch.Tensor,
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    alpha: torch.Tensor,
) -> torch.Tensor:
    """See causal_conv_snake_torch; fused for depthwise convs."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.causal_conv_snake(x, context, weight, bias, dilation, alpha)
    return causal_conv_snake_torch(x, context, weight, bias, dilation, alpha)


def causal_conv_transpose_snake(
    x: torch.Tensor,
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int,
    alpha: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See causal_conv_transpose_snake_torch; on CUDA the bias pass writes the Snake of its result too."""
    if _fused(x):
        from engine.kernels import triton_ops

        return triton_ops.causal_conv_transpose_snake(x, context, weight, bias, stride, alpha)
    return causal_conv_transpose_snake_torch(x, context, weight, bias, stride, alpha)
