"""Triton kernels for engine.kernels (CUDA only; imported lazily). Each keeps its torch twin's rounding points:
fp32 arithmetic inside, one rounding to the storage dtype exactly where the twin rounds. Inputs the kernels
do not cover (mixed dtypes, odd layouts) fall back to the twin, so callers never need to check."""

from __future__ import annotations

import os
from itertools import pairwise

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from engine.kernels import (
    BLOCK_MLP_ROWS,
    FEW_ROWS,
    FP8_BLOCK,
    FP8_MAX,
    FP8_MIN_AMAX,
    MAX_TINY_SEQ,
    LoRARows,
    NextSnake,
    cached_attention_torch,
    causal_conv_snake_torch,
    causal_conv_torch,
    causal_conv_transpose_snake_torch,
    conv_transpose_crop_torch,
    dense_attention_torch,
    guided_euler_torch_,
    lora_add_torch,
    pointwise_residual_snake_torch,
    pointwise_residual_torch,
    qk_norm_rope_torch,
    quantize_rows_torch,
    rms_norm_fp8_torch,
    rms_norm_torch,
    rope_torch,
    silu_mul_fp8_torch,
    silu_mul_torch,
    snake_beta_torch,
    snake_torch,
)

# Triton's CPU interpreter (TRITON_INTERPRET=1, how the kernels below were first run without a GPU) has no
# libdevice and no inline PTX.
if os.environ.get("TRITON_INTERPRET") == "1":

    @triton.jit
    def _sin(x):
        return tl.sin(x)

    @triton.jit
    def _rsqrt(x):
        return 1.0 / tl.sqrt(x)

else:

    @triton.jit
    def _sin(x):
        """sin of fp32 x by the SFU's sin.approx after an exact-ish reduction to [-π, π] (k = rint(x / 2π), x - k·2π
        with 2π split in two fp32 parts, each step one fma): absolute error ~1e-6 for |x| < 1e6, where arguments
        reach hundreds of radians. libdevice's sin, a polynomial with its own reduction, made the Snake kernels
        compute-bound: this one ran them 20-48 % faster on the H100 at the VAE's shapes, changing 0.03 % of fp16
        outputs by one ulp (the error against float64 unchanged)."""
        k = libdevice.rint(x * 0.15915494309189535)
        r = tl.fma(k, -6.2831854820251465, x)
        r = tl.fma(k, 1.7484555e-07, r)
        return tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [r], dtype=tl.float32, is_pure=True, pack=1)

    @triton.jit
    def _rsqrt(x):
        return libdevice.rsqrt(x)


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


# Kernels that run one program per token or row are throughput-bound on a large grid, where fewer, fuller warps per
# program win: at B=512's LocDiT shapes on an H200 (11,264 tokens of 2,048 + 256 features) RoPE took 0.045 ms at 2
# warps against 0.057 at 8, quantize_rows 0.036 at 1 against 0.051 at 8, and the tiny-row attention (2,048
# programs) 0.057 at 4 against 0.066 at 8 (benchmarks/results/h200-2026-11-29, call 6). A small grid (one stream's
# 22 LocDiT tokens) waits on each program's latency instead: it keeps the wider programs.
MANY_PROGRAMS = 2048


def _pass_warps(elements: int, per_thread: int, programs: int) -> int:
    if programs < MANY_PROGRAMS:
        return _warps(elements)
    return max(1, min(8, elements // (32 * per_thread)))


# -- Alignment hints -----------------------------------------------------------------------------------------------
# Lengths and strides that change with the batch or the streaming window are not specialised on (see _rope_kernel),
# so Triton cannot prove a row's elements 16-byte aligned and makes every load and store of them a 16-bit one. Their
# launchers pass instead ALIGN, the largest power of two up to _ALIGN that divides them all (a constexpr: four
# variants at most; the engine's shapes are multiples of 8): Snake, bias + residual and the depthwise conv at the VAE's
# first blocks took twice as long without it (h200-2026-12-02, call 1).
_ALIGN = 8  # 16-bit elements in a 16-byte vector


def _alignment(*values: int) -> int:
    align = _ALIGN
    while any(v % align for v in values):
        align //= 2
    return align


@triton.jit
def _aligned(v, ALIGN: tl.constexpr):
    """v, provably a multiple of ALIGN (the launcher's _alignment: exact), so that Triton's alignment analysis
    sees the rows' offsets (tl.multiple_of does not reach a kernel's scalar arguments)."""
    if ALIGN > 1:
        v = v // ALIGN * ALIGN
    return v


# -- RMSNorm (optionally fused with the residual add before it) --------------------------------------------------


@triton.jit
def _rms_norm_kernel(
    x_ptr, up_ptr, w_ptr, out_ptr, scale_ptr, sum_ptr, n_cols, eps,
    HAS_UPDATE: tl.constexpr, FP8: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    dtype: tl.constexpr = x_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    if HAS_UPDATE:
        update = tl.load(up_ptr + row * n_cols + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + update.to(tl.float32)).to(dtype)  # torch's rounded add
        tl.store(sum_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    variance = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * _rsqrt(variance + eps)).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (normed.to(tl.float32) * w).to(dtype)
    if FP8:  # the model-dtype output, quantised as quantize_rows would quantise it (the twin's rounding points)
        _store_fp8_row(y.to(tl.float32), out_ptr + row * n_cols, scale_ptr + row, cols, mask)
    else:
        tl.store(out_ptr + row * n_cols + cols, y, mask=mask)


def _norm_ok(x: torch.Tensor, weight: torch.Tensor, update: torch.Tensor | None = None) -> bool:
    ok = x.is_contiguous() and weight.dtype == x.dtype and weight.is_contiguous()
    if update is not None:
        ok = ok and update.is_contiguous() and update.dtype == x.dtype and update.shape == x.shape
    return ok


def _launch_norm(
    x: torch.Tensor, update: torch.Tensor | None, weight: torch.Tensor, eps: float, fp8: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x + update or x, the normed rows in x's dtype or e4m3, their fp8 scales [..., 1] or x)."""
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn if fp8 else x.dtype, device=x.device)
    scale = torch.empty(*x.shape[:-1], 1, dtype=torch.float32, device=x.device) if fp8 else x  # x: unwritten
    summed = torch.empty_like(x) if update is not None else x
    if rows:
        block = triton.next_power_of_2(n_cols)
        _rms_norm_kernel[(rows,)](
            x, update if update is not None else x, weight, out, scale, summed, n_cols, eps,
            HAS_UPDATE=update is not None, FP8=fp8, BLOCK=block, num_warps=_warps(block),
        )  # fmt: skip
    return summed, out, scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if not _norm_ok(x, weight):
        return rms_norm_torch(x, weight, eps)
    return _launch_norm(x, None, weight, eps, fp8=False)[1]


def add_rms_norm(
    x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if not _norm_ok(x, weight, update):
        summed = x + update
        return summed, rms_norm_torch(summed, weight, eps)
    return _launch_norm(x, update, weight, eps, fp8=False)[:2]


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if not (_norm_ok(x, weight) and 0 < x.shape[-1] <= _MAX_FP8_ROW):
        return rms_norm_fp8_torch(x, weight, eps)
    return _launch_norm(x, None, weight, eps, fp8=True)[1:]


def add_rms_norm_fp8(
    x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not (_norm_ok(x, weight, update) and 0 < x.shape[-1] <= _MAX_FP8_ROW):
        summed = x + update
        return summed, *rms_norm_fp8_torch(summed, weight, eps)
    return _launch_norm(x, update, weight, eps, fp8=True)


# -- RoPE on q and k, in place in the qkv buffer -----------------------------------------------------------------


# Integer arguments that vary with the batch or token count are not specialised on: Triton would otherwise
# compile a new variant the first time such a value is 1 or not a multiple of 16, a stall mid-serve.
@triton.jit
def _rope_heads(base, cos1, cos2, sin1, sin2, H: tl.constexpr, H_P: tl.constexpr, D: tl.constexpr):
    """Rotate one token's H heads in place. Each thread loads BOTH halves of the elements it rotates before it
    stores them: were x[d] and its partner x[d + D/2] held by different threads, one thread's store could land
    before the other's load of the same element (nothing orders them in global memory)."""
    h = tl.arange(0, H_P)[:, None]
    mask = h < H
    ptr = base + h * D + tl.arange(0, D // 2)[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + D // 2, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr, (x1 * cos1 - x2 * sin1).to(base.dtype.element_ty), mask=mask)
    tl.store(ptr + D // 2, (x2 * cos2 + x1 * sin2).to(base.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def _rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_stride, k_stride, n_rows,
    HQ: tl.constexpr, HK: tl.constexpr, HQ_P: tl.constexpr, HK_P: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    row = token % n_rows
    half = tl.arange(0, D // 2)[None, :]
    cos1 = tl.load(cos_ptr + row * D + half).to(tl.float32)
    cos2 = tl.load(cos_ptr + row * D + D // 2 + half).to(tl.float32)
    sin1 = tl.load(sin_ptr + row * D + half).to(tl.float32)
    sin2 = tl.load(sin_ptr + row * D + D // 2 + half).to(tl.float32)
    _rope_heads(q_ptr + token * q_stride, cos1, cos2, sin1, sin2, HQ, HQ_P, D)
    _rope_heads(k_ptr + token * k_stride, cos1, cos2, sin1, sin2, HK, HK_P, D)


def _token_stride(x: torch.Tensor) -> int | None:
    """Stride between tokens of x [..., H, D] when each token's heads are packed ([H, D] contiguous) and the
    leading dims flatten to one token axis (true of q/k split from a contiguous qkv output); else None. Leading
    dims of size 1 are skipped: their stride is arbitrary (a [B, 1, H, D] view of a qkv buffer has one of H * D)."""
    heads, dim = x.shape[-2:]
    if x.stride(-1) != 1 or x.stride(-2) != dim:
        return None
    lead = [i for i in range(x.dim() - 2) if x.shape[i] != 1]
    if not lead:
        return heads * dim  # one token: any stride will do
    for i, j in pairwise(lead):
        if x.stride(i) != x.stride(j) * x.shape[j]:
            return None
    return x.stride(lead[-1])


def rope_qk_(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    dim = q.shape[-1]
    q_stride, k_stride = _token_stride(q), _token_stride(k)
    tables = cos.reshape(-1, dim), sin.reshape(-1, dim)
    ok = (
        q_stride is not None
        and k_stride is not None
        and q.dtype == k.dtype
        and dim == triton.next_power_of_2(dim)
        and all(t.is_contiguous() and t.dtype == q.dtype for t in tables)
        and q.shape[:-2] == k.shape[:-2]
    )
    if not ok:
        return rope_torch(q, cos, sin), rope_torch(k, cos, sin)
    tokens = q.numel() // (q.shape[-2] * dim)
    if tokens:
        hq, hk = q.shape[-2], k.shape[-2]
        _rope_kernel[(tokens,)](
            q, k, tables[0], tables[1], q_stride, k_stride, tables[0].shape[0],
            HQ=hq, HK=hk, HQ_P=triton.next_power_of_2(hq), HK_P=triton.next_power_of_2(hk), D=dim,
            num_warps=_pass_warps(hq * dim, per_thread=32, programs=tokens),
        )  # fmt: skip
    return q, k


# -- SiLU(gate) * up ---------------------------------------------------------------------------------------------


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)  # F.silu rounds here
    tl.store(out_ptr + row * n_cols + cols, (act.to(tl.float32) * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if not gate_up.is_contiguous():
        return silu_mul_torch(gate_up)
    n_cols = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], n_cols, dtype=gate_up.dtype, device=gate_up.device)
    rows = out.numel() // n_cols if n_cols else 0
    if rows:
        block = min(1024, triton.next_power_of_2(n_cols))
        _silu_mul_kernel[(rows, triton.cdiv(n_cols, block))](gate_up, out, n_cols, BLOCK=block, num_warps=4)
    return out


# -- GEMMs of a few rows (one stream's step): a stream over the weight -------------------------------------------
#
# A few rows times a weight is a read of the weight, yet at one VoxCPM2 stream's shapes (LMs 1 row, LocDiT 22)
# cuBLAS took 6.9-16.5 us a GEMM on an H200, 0.5-3.1 TB/s of the 4.8 (benchmarks/results/h200-2026-11-29b,
# skinny_gemm_bench.py).
# Each program here owns FEW_ROWS_BN output features of every row and walks K: y.T = w @ x.T, so the weight's
# features fill the MMA's wide side and the rows (padded to 16) its narrow one. Where that leaves few programs to
# keep the memory busy (a narrow N over a long K: o and down projections), each takes a quarter of K and the last
# of a tile's programs to finish sums the four partials (stream-K's fixup, in a fixed order, so any arrival order
# gives the same sum).

FEW_ROWS_BN = 64
# N at most this over K >= 2048 splits K in 4: call 2's best configuration at each such shape (the o and down
# projections), where N = 2,560 (the LMs' qkv) was best unsplit.
_FEW_ROWS_SPLIT_N = 2048
_FEW_ROWS_BK = 128
# Partials and arrival counts of split launches, by (device, N, padded rows). Launches on one stream run one after
# another and the last program of a tile sets its count back to 0, so launches (and graph replays) share them.
_split_scratch: dict[tuple[torch.device, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


@triton.jit
def _few_rows_kernel(
    x_ptr, w_ptr, y_ptr, part_ptr, count_ptr, M, N, K: tl.constexpr, stride_x, stride_y,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr,
):  # fmt: skip
    """y [M, N] = x [M, K] @ w[:N].T, or with GATED (w [2N, K]: gate rows, then up rows) silu(x @ gate.T) * (x @
    up.T), rounded where silu_mul rounds. Program (n, s) makes features n*BN.. of all M (<= BM) rows over the s-th
    of SPLIT slices of K."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    ns = pid_n * BN + tl.arange(0, BN)
    ms = tl.arange(0, BM)
    ks = tl.arange(0, BK)
    K_PART: tl.constexpr = K // SPLIT
    w_at = w_ptr + ns.to(tl.int64)[:, None] * K + pid_k * K_PART + ks[None, :]
    x_at = x_ptr + ms[None, :] * stride_x + pid_k * K_PART + ks[:, None]
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    acc_up = tl.zeros([BN, BM], dtype=tl.float32)
    for k in tl.range(0, K_PART, BK, num_stages=4):
        x = tl.load(x_at + k, mask=ms[None, :] < M, other=0.0)
        acc = tl.dot(tl.load(w_at + k), x, acc)
        if GATED:
            acc_up = tl.dot(tl.load(w_at + N * K + k), x, acc_up)
    out_at = y_ptr + ms[None, :] * stride_y + ns[:, None]
    dtype = y_ptr.dtype.element_ty
    if SPLIT == 1:
        if GATED:
            gate = acc.to(dtype).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # F.silu rounds here
            acc = act * acc_up.to(dtype).to(tl.float32)
        tl.store(out_at, acc.to(dtype), mask=ms[None, :] < M)
    else:
        tile = ns[:, None] * BM + ms[None, :]
        tl.store(part_ptr + pid_k * N * BM + tile, acc, cache_modifier=".cg")
        tl.debug_barrier()  # every thread's partial is written before the count says so
        if tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1:
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                acc += tl.load(part_ptr + s * N * BM + tile, cache_modifier=".cg")
            tl.store(out_at, acc.to(dtype), mask=ms[None, :] < M)
            tl.atomic_xchg(count_ptr + pid_n, 0)


def few_rows_fit(x: torch.Tensor, weight: torch.Tensor, gated: bool) -> bool:
    """Whether few_rows_linear takes x [..., K] (at most FEW_ROWS rows) times weight [N, K]."""
    n, k = weight.shape
    rows = x.numel() // k if k else 0
    return (
        0 < rows <= FEW_ROWS
        and x.dtype == weight.dtype
        and x.dtype in (torch.bfloat16, torch.float16)
        and x.is_contiguous()
        and weight.is_contiguous()
        and n % (2 * FEW_ROWS_BN if gated else FEW_ROWS_BN) == 0
        and k % (4 * _FEW_ROWS_BK) == 0
    )


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> torch.Tensor:
    """F.linear(x, weight) (or silu_mul of it, `gated`) for x that few_rows_fit."""
    k = weight.shape[1]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    rows = x.numel() // k
    y = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    bm = max(16, triton.next_power_of_2(rows))
    tiles = n // FEW_ROWS_BN
    split = 4 if not gated and n <= _FEW_ROWS_SPLIT_N and k >= 2048 else 1
    part = count = y  # unread unless split
    if split > 1:
        key = (x.device, n, bm)
        if key not in _split_scratch:
            _split_scratch[key] = (
                torch.empty(split * n * bm, device=x.device, dtype=torch.float32),
                torch.zeros(tiles, device=x.device, dtype=torch.int32),
            )
        part, count = _split_scratch[key]
    _few_rows_kernel[(tiles, split)](
        x, weight, y, part, count, rows, n, k, k, n,
        BM=bm, BN=FEW_ROWS_BN, BK=_FEW_ROWS_BK, SPLIT=split, GATED=gated, num_warps=4,
    )  # fmt: skip
    return y


# -- FP8 rows: one program per row (K <= 16384 in one block), the scale from the row's amax ---------------------

_FP8_MAX = tl.constexpr(FP8_MAX)  # a jitted function reads module globals only as constexprs
_FP8_MIN_AMAX = tl.constexpr(FP8_MIN_AMAX)
_FP8_INVERSE_MAX = tl.constexpr(1 / FP8_MAX)


@triton.jit
def _store_fp8_row(y, q_ptr, scale_ptr, cols, mask):
    """Quantise the fp32 row y (masked lanes 0) as quantize_rows_torch does: scale = max(amax, min) / FP8_MAX."""
    scale = tl.maximum(tl.max(tl.abs(y), axis=0), _FP8_MIN_AMAX) / _FP8_MAX
    tl.store(scale_ptr, scale)
    tl.store(q_ptr + cols, (y / scale).to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    _store_fp8_row(x, q_ptr + row * n_cols, scale_ptr + row, cols, mask)


@triton.jit
def _silu_mul_fp8_kernel(gu_ptr, q_ptr, scale_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(gu_ptr.dtype.element_ty)  # F.silu rounds here
    y = (act.to(tl.float32) * up).to(gu_ptr.dtype.element_ty)  # and the product, as silu_mul's output
    _store_fp8_row(y.to(tl.float32), q_ptr + row * n_cols, scale_ptr + row, cols, mask)


_MAX_FP8_ROW = 16384


def _fp8_rows(n_cols: int, rows: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    q = torch.empty(rows, n_cols, dtype=torch.float8_e4m3fn, device=like.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=like.device)
    return q, scale, triton.next_power_of_2(n_cols)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 2 or not x.is_contiguous() or not 0 < x.shape[1] <= _MAX_FP8_ROW:
        return quantize_rows_torch(x)
    q, scale, block = _fp8_rows(x.shape[1], x.shape[0], x)
    if x.shape[0]:
        warps = _pass_warps(block, per_thread=64, programs=x.shape[0])
        _quantize_rows_kernel[(x.shape[0],)](x, q, scale, x.shape[1], BLOCK=block, num_warps=warps)
    return q, scale


def silu_mul_fp8(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n_cols = gate_up.shape[-1] // 2
    if not gate_up.is_contiguous() or not 0 < n_cols <= _MAX_FP8_ROW:
        return silu_mul_fp8_torch(gate_up)
    rows = gate_up.numel() // (2 * n_cols)
    q, scale, block = _fp8_rows(n_cols, rows, gate_up)
    if rows:
        _silu_mul_fp8_kernel[(rows,)](gate_up, q, scale, n_cols, BLOCK=block, num_warps=_warps(block))
    lead = gate_up.shape[:-1]
    return q.view(*lead, n_cols), scale.view(*lead, 1)


@triton.jit
def _gate_up_silu_fp8_kernel(
    a_ptr, w_ptr, sa_ptr, sw_ptr, q_ptr, s_ptr, M, M_OUT, N, K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    """a [M, K] e4m3 with row scales sa [M]; w [2N, K] e4m3, gate rows then up rows, with scales sw [2N]. Each
    program makes a [BM, BN] tile of h = silu(gate) * up (rounded to ROUND where the twin rounds) and writes it as
    e4m3 with one scale per row (BN = FP8_BLOCK columns): q [M_OUT, N], s [N / BN, M_OUT], rows M.. of them zeros."""
    # Programs that share a band of GROUP_M row tiles run together, so the band's rows of `a` stay in L2.
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M_OUT, BM), N // BN
    band = (pid // (GROUP_M * grid_n)) * GROUP_M
    band_m = min(grid_m - band, GROUP_M)
    pid_m = band + (pid % (GROUP_M * grid_n)) % band_m
    pid_n = (pid % (GROUP_M * grid_n)) // band_m
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    row_ok = rows < M
    a_at = a_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :]
    g_at = w_ptr + cols.to(tl.int64)[None, :] * K + ks[:, None]
    u_at = g_at + N * K
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_at + k, mask=row_ok[:, None], other=0.0)
        acc_g = tl.dot(a, tl.load(g_at + k), acc_g)
        acc_u = tl.dot(a, tl.load(u_at + k), acc_u)
    sa = tl.load(sa_ptr + rows, mask=row_ok, other=0.0)[:, None]
    gate = (acc_g * sa * tl.load(sw_ptr + cols)[None, :]).to(ROUND).to(tl.float32)
    up = (acc_u * sa * tl.load(sw_ptr + N + cols)[None, :]).to(ROUND).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(ROUND).to(tl.float32)  # F.silu rounds here
    h = (act * up).to(ROUND).to(tl.float32)  # and the product
    scale = tl.maximum(tl.max(tl.abs(h), axis=1), _FP8_MIN_AMAX) / _FP8_MAX
    q = (h / scale[:, None]).to(q_ptr.dtype.element_ty)
    out_ok = rows < M_OUT
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], q, mask=out_ok[:, None])
    tl.store(s_ptr + pid_n * M_OUT + rows, scale, mask=out_ok)


# (BM, BK, warps, stages) of the gate/up kernel: the best of five configurations at the LocDiT's shapes on an H200 (M =
# 11264, K = 1024, N = 4096). ptxas gives it 250 registers a thread and 144 KiB of shared memory, one program an SM
# (benchmarks/gate_up_bench.py --registers; its --sweep times the others).
GATE_UP_LAUNCH = (128, 128, 8, 3)


def gate_up_silu_fp8(
    q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype,
    launch: tuple[int, int, int, int] = GATE_UP_LAUNCH,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """kernels.gate_up_silu_fp8_torch for q [M, K] (K a multiple of 128, weight [2N, K] with N one of FP8_BLOCK),
    its rows padded with zeros to a multiple of BLOCK_MLP_ROWS and its block scales a column-major
    [rows, N / FP8_BLOCK] view: what cuBLAS's block-scaled GEMM takes (kernels.fp8_block_mlp). `launch`: (BM, BK,
    warps, stages), for benchmarks to weigh against GATE_UP_LAUNCH."""
    (m, k), n = q.shape, weight.shape[0] // 2
    m_out = -(-m // BLOCK_MLP_ROWS) * BLOCK_MLP_ROWS
    h = torch.empty(m_out, n, device=q.device, dtype=q.dtype)
    h_scale = torch.empty(n // FP8_BLOCK, m_out, device=q.device, dtype=torch.float32)
    if m_out:
        bm, bk, warps, stages = launch
        grid = (triton.cdiv(m_out, bm) * (n // FP8_BLOCK),)
        _gate_up_silu_fp8_kernel[grid](
            q, weight, scale, weight_scale, h, h_scale, m, m_out, n, k,
            BM=bm, BN=FP8_BLOCK, BK=bk, GROUP_M=8, ROUND=_ROUND[dtype], num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return h, h_scale.t()


_ROUND = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


# -- Snake (AudioVAE activation) and the depthwise causal conv it follows -------------------------------------


@triton.jit
def _snake(y, alpha):
    """fp32 Snake of fp32 y: y + sin²(αy) * (1 / α) with the reference's 1e-9 guard; alpha is per row ([ROWS, 1]),
    so the reciprocal is one per row (the twin's order too), not a division per element."""
    s = _sin(alpha * y)
    return y + s * s * (1.0 / (alpha + 1e-9))


# The VAE's row-wise kernels (Snake, SnakeBeta, the depthwise conv, bias + residual) work on [B, C, L] tensors as
# B * C rows of L frames; rows may be strided (a conv-transpose output sliced in time), outputs are contiguous. A
# program takes a [ROWS, BLOCK] tile of rows x time of ~_TILE elements: the first VAE blocks run 4-32 frames a
# call, and one row per program left most lanes idle and made up to 10^6 programs a launch at 512 streams.
# Shapes and strides change with the batch and the streaming window: see _alignment.
_TILE = 1024


def _row_tiles(rows: int, length: int, *strides: int) -> tuple[tuple[int, int], int, int, int]:
    """(grid, ROWS, BLOCK, ALIGN) for `rows` rows of `length` frames: BLOCK is the largest power of two up to _TILE
    that leaves at most an eighth of the row's last block idle (192 frames: three blocks of 64, not one of 256);
    ALIGN: _alignment of the length and the rows' `strides`."""
    block = min(_TILE, triton.next_power_of_2(length))
    while block > 16 and triton.cdiv(length, block) * block - length > length // 8:
        block //= 2
    per_program = _TILE // block
    grid = (triton.cdiv(rows, per_program), triton.cdiv(length, block))
    return grid, per_program, block, _alignment(length, *strides)


@triton.jit
def _row_tile(n_rows, length, channels, ROWS: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr):
    """This program's tile: each row's batch index and channel [ROWS], the frames [BLOCK], the mask [ROWS, BLOCK]
    and the offsets into a contiguous [B, C, L] output."""
    length = _aligned(length, ALIGN)
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    b, c = (row // channels).to(tl.int64), row % channels
    mask = (row < n_rows)[:, None] & (t < length)[None, :]
    return b, c, t, mask, row.to(tl.int64)[:, None] * length + t[None, :]


@triton.jit(do_not_specialize=["n_rows", "length", "channels", "x_sb", "x_sc"])
def _snake_kernel(
    x_ptr, alpha_ptr, scale_ptr, shift_ptr, out_ptr, n_rows, length, channels, x_sb, x_sc,
    AFFINE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    b, c, t, mask, out_at = _row_tile(n_rows, length, channels, ROWS, BLOCK, ALIGN)
    x_row = b * _aligned(x_sb, ALIGN) + c * _aligned(x_sc, ALIGN)
    x = tl.load(x_ptr + x_row[:, None] + t[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    if AFFINE:  # x * scale + shift in fp32, not rounded before the Snake (the twin's two 16-bit ops round twice)
        x = x * tl.load(scale_ptr + c).to(tl.float32)[:, None] + tl.load(shift_ptr + c).to(tl.float32)[:, None]
    alpha = tl.load(alpha_ptr + c).to(tl.float32)[:, None]
    tl.store(out_ptr + out_at, _snake(x, alpha).to(out_ptr.dtype.element_ty), mask=mask)


def _per_channel(t: torch.Tensor, x: torch.Tensor) -> bool:
    return t.numel() == x.shape[1] and t.dtype == x.dtype


def snake(
    x: torch.Tensor, alpha: torch.Tensor, affine: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    params = (alpha, *(affine or ()))
    if not (x.dim() == 3 and x.stride(-1) == 1 and all(_per_channel(p, x) for p in params)):
        return snake_torch(x, alpha, affine)
    batch, channels, length = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    alpha = alpha.contiguous()
    scale, shift = (p.contiguous() for p in affine) if affine is not None else (alpha, alpha)  # unread if None
    if out.numel():
        grid, rows, block, align = _row_tiles(batch * channels, length, x.stride(0), x.stride(1))
        _snake_kernel[grid](
            x, alpha, scale, shift, out, batch * channels, length, channels, x.stride(0), x.stride(1),
            AFFINE=affine is not None, ROWS=rows, BLOCK=block, ALIGN=align, num_warps=4,
        )  # fmt: skip
    return out


# -- Attention over a dense per-row cache (the Qwen3-TTS code predictor) -------------------------------------------


@triton.jit(do_not_specialize=["start", "len_q", "q_sb", "q_ss", "k_sb", "k_ss", "v_sb", "v_ss"])
def _cached_attention_kernel(
    q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, out_ptr, start, len_q, scale,
    q_sb, q_ss, k_sb, k_ss, v_sb, v_ss,
    MAX: tl.constexpr, MAX_P: tl.constexpr, HK: tl.constexpr, G: tl.constexpr, G_P: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.arange(0, MAX_P)
    d = tl.arange(0, D)
    end = start + len_q
    # keys/values: the cache before `start`, this call's rows from k/v (as the twin reads them back after its copy)
    cached = (pos < start)[:, None]
    new = ((pos >= start) & (pos < end))[:, None]
    cache_at = b * MAX * HK * D + pos[:, None] * HK * D + h * D + d[None, :]
    row = tl.where(pos >= start, pos - start, 0)[:, None]
    k_at = k_ptr + b * k_sb + row * k_ss + h * D + d[None, :]
    v_at = v_ptr + b * v_sb + row * v_ss + h * D + d[None, :]
    keys = tl.load(kc_ptr + cache_at, mask=cached, other=0.0) + tl.load(k_at, mask=new, other=0.0).to(tl.float32)
    values = tl.load(vc_ptr + cache_at, mask=cached, other=0.0) + tl.load(v_at, mask=new, other=0.0).to(tl.float32)
    s = tl.program_id(2)  # this program's query position (start + s); the first one writes the new rows
    tl.store(kc_ptr + cache_at, keys, mask=new & (s == 0))
    tl.store(vc_ptr + cache_at, values, mask=new & (s == 0))
    g = tl.arange(0, G_P)
    q_at = q_ptr + b * q_sb + s * q_ss + (h * G + g)[:, None] * D + d[None, :]
    q = tl.load(q_at, mask=(g < G)[:, None], other=0.0).to(tl.float32)
    scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [G_P, MAX_P]
    scores = tl.where((pos <= start + s)[None, :], scores, float("-inf"))
    probs = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    probs = probs / tl.sum(probs, axis=1)[:, None]
    out = tl.sum(probs[:, :, None] * values[None, :, :], axis=1)  # [G_P, D]
    out_at = out_ptr + (b * len_q + s) * (HK * G * D) + (h * G + g)[:, None] * D + d[None, :]
    tl.store(out_at, out.to(out_ptr.dtype.element_ty), mask=(g < G)[:, None])


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    scale: float,
) -> torch.Tensor:
    batch, len_q, heads, dim = q.shape
    kv_heads, max_len = k.shape[2], k_cache.shape[1]
    ok = (
        all(t.stride(-1) == 1 and t.stride(-2) == dim for t in (q, k, v))
        and k.shape == v.shape == (batch, len_q, kv_heads, dim)
        and heads % kv_heads == 0
        and dim == triton.next_power_of_2(dim)
        and all(c.dtype == torch.float32 and c.is_contiguous() and c.shape == (batch, max_len, kv_heads, dim)
                for c in (k_cache, v_cache))
        and start + len_q <= max_len <= 64
    )  # fmt: skip
    if not ok:
        return cached_attention_torch(q, k, v, k_cache, v_cache, start, scale)
    out = torch.empty(batch, len_q, heads * dim, dtype=q.dtype, device=q.device)
    if out.numel():
        group = heads // kv_heads
        _cached_attention_kernel[(batch, kv_heads, len_q)](
            q, k, v, k_cache, v_cache, out, start, len_q, scale,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            MAX=max_len, MAX_P=triton.next_power_of_2(max_len), HK=kv_heads, G=group,
            G_P=triton.next_power_of_2(group), D=dim, num_warps=4,
        )  # fmt: skip
    return out


# -- SnakeBeta (the Qwen3-TTS codec's activation) ---------------------------------------------------------------


@triton.jit(do_not_specialize=["n_rows", "length", "channels", "x_sb", "x_sc"])
def _snake_beta_kernel(
    x_ptr, la_ptr, lb_ptr, out_ptr, n_rows, length, channels, x_sb, x_sc,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    b, c, t, mask, out_at = _row_tile(n_rows, length, channels, ROWS, BLOCK, ALIGN)
    x_row = b * _aligned(x_sb, ALIGN) + c * _aligned(x_sc, ALIGN)
    x = tl.load(x_ptr + x_row[:, None] + t[None, :], mask=mask, other=0.0).to(tl.float32)
    alpha = tl.exp(tl.load(la_ptr + c).to(tl.float32))[:, None]
    inv_beta = (1.0 / (tl.exp(tl.load(lb_ptr + c).to(tl.float32)) + 1e-9))[:, None]
    s = _sin(x * alpha)
    tl.store(out_ptr + out_at, (x + inv_beta * (s * s)).to(out_ptr.dtype.element_ty), mask=mask)


def snake_beta(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> torch.Tensor:
    channels = x.shape[1] if x.dim() == 3 else -1
    ok = (
        x.dim() == 3
        and x.stride(-1) == 1
        and all(p.numel() == channels and p.is_contiguous() for p in (log_alpha, log_beta))
    )
    if not ok:
        return snake_beta_torch(x, log_alpha, log_beta)
    batch, _, length = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        grid, rows, block, align = _row_tiles(batch * channels, length, x.stride(0), x.stride(1))
        _snake_beta_kernel[grid](
            x, log_alpha, log_beta, out, batch * channels, length, channels, x.stride(0), x.stride(1),
            ROWS=rows, BLOCK=block, ALIGN=align, num_warps=4,
        )  # fmt: skip
    return out


# -- Qwen3's per-head q/k RMSNorm and RoPE, in place in the qkv buffer -------------------------------------------


@triton.jit
def _norm_rope_heads(base, w1, w2, eps, cos1, cos2, sin1, sin2, H: tl.constexpr, H_P: tl.constexpr, D: tl.constexpr):
    """RMSNorm then rotate one token's H heads in place, with the twin's roundings (normed to the storage dtype, times
    the weight rounded again, rotation in fp32 rounded once). Each thread loads both halves it rotates before it
    stores them (see _rope_heads)."""
    dtype = base.dtype.element_ty
    h = tl.arange(0, H_P)[:, None]
    mask = h < H
    ptr = base + h * D + tl.arange(0, D // 2)[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + D // 2, mask=mask, other=0.0).to(tl.float32)
    r = _rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)[:, None]
    n1 = ((x1 * r).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
    n2 = ((x2 * r).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    tl.store(ptr, (n1 * cos1 - n2 * sin1).to(dtype), mask=mask)
    tl.store(ptr + D // 2, (n2 * cos2 + n1 * sin2).to(dtype), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def _qk_norm_rope_kernel(
    q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_stride, k_stride, n_rows, eps,
    HQ: tl.constexpr, HK: tl.constexpr, HQ_P: tl.constexpr, HK_P: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    row = token % n_rows
    half = tl.arange(0, D // 2)[None, :]
    cos1 = tl.load(cos_ptr + row * D + half).to(tl.float32)
    cos2 = tl.load(cos_ptr + row * D + D // 2 + half).to(tl.float32)
    sin1 = tl.load(sin_ptr + row * D + half).to(tl.float32)
    sin2 = tl.load(sin_ptr + row * D + D // 2 + half).to(tl.float32)
    qw1, qw2 = tl.load(qw_ptr + half).to(tl.float32), tl.load(qw_ptr + D // 2 + half).to(tl.float32)
    kw1, kw2 = tl.load(kw_ptr + half).to(tl.float32), tl.load(kw_ptr + D // 2 + half).to(tl.float32)
    _norm_rope_heads(q_ptr + token * q_stride, qw1, qw2, eps, cos1, cos2, sin1, sin2, HQ, HQ_P, D)
    _norm_rope_heads(k_ptr + token * k_stride, kw1, kw2, eps, cos1, cos2, sin1, sin2, HK, HK_P, D)


def qk_norm_rope_(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    dim = q.shape[-1]
    q_stride, k_stride = _token_stride(q), _token_stride(k)
    tables = cos.reshape(-1, dim), sin.reshape(-1, dim)
    ok = (
        q_stride is not None
        and k_stride is not None
        and q.dtype == k.dtype == q_weight.dtype == k_weight.dtype
        and q.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and dim == triton.next_power_of_2(dim)
        and q_weight.is_contiguous()
        and k_weight.is_contiguous()
        # fp32 tables (the twin rotates in fp32 whatever their dtype; the model's are fp32)
        and all(t.is_contiguous() and t.dtype == torch.float32 for t in tables)
        and q.shape[:-2] == k.shape[:-2]
    )
    if not ok:
        return qk_norm_rope_torch(q, k, q_weight, k_weight, eps, cos, sin)
    tokens = q.numel() // (q.shape[-2] * dim)
    if tokens:
        hq, hk = q.shape[-2], k.shape[-2]
        _qk_norm_rope_kernel[(tokens,)](
            q, k, q_weight, k_weight, tables[0], tables[1], q_stride, k_stride, tables[0].shape[0], eps,
            HQ=hq, HK=hk, HQ_P=triton.next_power_of_2(hq), HK_P=triton.next_power_of_2(hk), D=dim,
            num_warps=_warps(hq * dim),
        )  # fmt: skip
    return q, k


# -- Counter noise (engine.noise): uniforms from a hash of (seed, step, counter) ------------------------------------


@triton.jit
def _mix32(x):
    """lowbias32 on uint32 (engine.noise._mix32; uint32 products wrap modulo 2**32 as its split products do)."""
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full(x.shape, 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit(do_not_specialize=["count"])
def _counter_uniform_kernel(seed_ptr, step_ptr, out_ptr, count, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < count
    seed = tl.load(seed_ptr + row + tl.zeros([BLOCK], tl.int64))  # int64 in [0, 2**63)
    step = tl.load(step_ptr + row + tl.zeros([BLOCK], tl.int64))
    key = _mix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ tl.full([BLOCK], 0x9E3779B9, tl.uint32))
    key = _mix32(key ^ (seed >> 32).to(tl.uint32))
    key = _mix32(key ^ (step & 0xFFFFFFFF).to(tl.uint32))
    bits = _mix32(_mix32(key ^ cols.to(tl.uint32)) ^ key)
    u = (bits.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # 2**-32, exact
    tl.store(out_ptr + row * count + cols, u, mask=mask)


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor, count: int) -> torch.Tensor:
    ok = seeds.dtype == steps.dtype == torch.int64 and seeds.dim() == steps.dim() == 1 and count < 2**32
    if not ok:
        from engine.noise import uniform_torch

        return uniform_torch(seeds, steps, count)
    seeds, steps = seeds.contiguous(), steps.expand(seeds.shape[0]).contiguous()
    out = torch.empty(seeds.shape[0], count, dtype=torch.float64, device=seeds.device)
    if out.numel():
        block = min(1024, triton.next_power_of_2(count))
        _counter_uniform_kernel[(seeds.shape[0], triton.cdiv(count, block))](seeds, steps, out, count, BLOCK=block)
    return out


# -- A conv's bias (and the residual add after it) in one pass, in place on its output, and the next Snake ----------
# The VAE's Snakes each read a conv's output once more: the pass that finishes that output (its bias, a residual unit's
# residual add) applies the next layer's Snake too and writes it beside the output (or instead of it, where only the
# Snake's output is read on: the end of a decoder block, whose output goes to the next block's first Snake alone).


@triton.jit(do_not_specialize=["n_rows", "length", "channels", "y_sb", "y_sc", "r_sb", "r_sc"])
def _bias_residual_kernel(
    y_ptr, bias_ptr, res_ptr, s_ptr, alpha_ptr, scale_ptr, shift_ptr, n_rows, length, channels, y_sb, y_sc, r_sb, r_sc,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, KEEP: tl.constexpr, SNAKE: tl.constexpr,
    AFFINE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    b, c, t, mask, out_at = _row_tile(n_rows, length, channels, ROWS, BLOCK, ALIGN)
    y_at = y_ptr + (b * _aligned(y_sb, ALIGN) + c * _aligned(y_sc, ALIGN))[:, None] + t[None, :]
    y = tl.load(y_at, mask=mask, other=0.0)
    if HAS_BIAS:  # torch's conv bias add_, rounded
        y = (y.to(tl.float32) + tl.load(bias_ptr + c).to(tl.float32)[:, None]).to(y_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        r_row = b * _aligned(r_sb, ALIGN) + c * _aligned(r_sc, ALIGN)
        r = tl.load(res_ptr + r_row[:, None] + t[None, :], mask=mask, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(y_ptr.dtype.element_ty)
    if KEEP:
        tl.store(y_at, y, mask=mask)
    if SNAKE:  # of the rounded output, as _snake_kernel would load it
        v = y.to(tl.float32)
        if AFFINE:
            v = v * tl.load(scale_ptr + c).to(tl.float32)[:, None] + tl.load(shift_ptr + c).to(tl.float32)[:, None]
        alpha = tl.load(alpha_ptr + c).to(tl.float32)[:, None]
        tl.store(s_ptr + out_at, _snake(v, alpha).to(s_ptr.dtype.element_ty), mask=mask)


def _fits(snake: NextSnake | None, y: torch.Tensor) -> bool:
    return snake is None or all(_per_channel(p, y) for p in (snake[0], *(snake[1] or ())))


def _bias_residual_(
    y: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    snake: NextSnake | None = None,
    keep: bool = True,
) -> torch.Tensor | None:
    """y [B, C, L] (time stride 1) += bias[:, None] (rounded), then residual + y, in place (unless not `keep`); with
    `snake`, returns snake(y, *snake) (contiguous) from the same pass."""
    batch, channels, length = y.shape
    out = torch.empty(y.shape, dtype=y.dtype, device=y.device) if snake is not None else None
    if y.numel():
        r = residual if residual is not None else y  # unread without a residual
        grid, rows, block, align = _row_tiles(batch * channels, length, *y.stride()[:2], *r.stride()[:2])
        alpha, affine = snake if snake is not None else (y, None)  # unread without a Snake
        scale, shift = (p.contiguous() for p in affine) if affine is not None else (y, y)
        _bias_residual_kernel[grid](
            y, bias if bias is not None else y, r, out if out is not None else y, alpha.contiguous(), scale, shift,
            batch * channels, length, channels, y.stride(0), y.stride(1), r.stride(0), r.stride(1),
            HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, KEEP=keep, SNAKE=snake is not None,
            AFFINE=affine is not None, ROWS=rows, BLOCK=block, ALIGN=align, num_warps=4,
        )  # fmt: skip
    return out


def _pointwise(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    snake: NextSnake | None,
    keep: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None] | None:
    """(output, its Snake) of a residual unit's pointwise conv + bias + residual, or None where the kernel does not
    fit (the twin's cases)."""
    batch, _, length = h.shape
    channels = weight.shape[0]
    ok = (
        h.dim() == 3
        and weight.shape[-1] == 1
        and residual.shape == (batch, channels, length)
        and residual.stride(-1) == 1
        and all(t.dtype == h.dtype for t in (weight, residual, *([bias] if bias is not None else [])))
        and _fits(snake, residual)
    )
    if not ok:
        return None
    y = F.conv1d(h, weight)
    if y.stride(-1) != 1:
        y = y.contiguous()
    activated = _bias_residual_(y, bias, residual, snake, keep)
    return (y if keep else None), activated


def pointwise_residual(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor
) -> torch.Tensor:
    done = _pointwise(h, weight, bias, residual, None, True)
    if done is None:
        return pointwise_residual_torch(h, weight, bias, residual)
    assert done[0] is not None
    return done[0]


def pointwise_residual_snake(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    alpha: torch.Tensor,
    affine: tuple[torch.Tensor, torch.Tensor] | None,
    keep: bool,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    done = _pointwise(h, weight, bias, residual, (alpha, affine), keep)
    if done is None or done[1] is None:
        return pointwise_residual_snake_torch(h, weight, bias, residual, alpha, affine, keep)
    return done[0], done[1]


def conv_transpose_crop(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int, left: int, right: int
) -> torch.Tensor:
    if not (x.dim() == 3 and (bias is None or bias.dtype == x.dtype)):
        return conv_transpose_crop_torch(x, weight, bias, stride, left, right)
    y = F.conv_transpose1d(x, weight, None, stride)
    if y.stride(-1) != 1:
        y = y.contiguous()
    y = y[..., left : y.shape[-1] - right]
    if bias is not None:
        _bias_residual_(y, bias, None)
    return y


def _causal_transpose(
    x: torch.Tensor,
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int,
    snake: NextSnake | None,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """cuDNN's transposed conv of x alone, then the context frame's part of the first `stride` samples (one small
    GEMM) added in place: the concatenation of the context, a misaligned copy of the whole input (the VAE's six
    took ~2 ms of a 512-stream VoxCPM2 step on an H100), is gone. Those samples round twice (the conv's output,
    then the sum). None where the kernel does not fit."""
    batch, cin, length = x.shape
    cout = weight.shape[1]
    ok = (
        weight.shape == (cin, cout, 2 * stride)
        and context.shape == (batch, cin, 1)
        and length > 0
        and all(t.dtype == x.dtype for t in (context, weight, *([bias] if bias is not None else [])))
        and (snake is None or all(t.numel() == cout and t.dtype == x.dtype for t in (snake[0], *(snake[1] or ()))))
    )
    if not ok:
        return None
    y = F.conv_transpose1d(x, weight, None, stride)  # [B, Cout, (L + 1) * stride]: x[-1] taken as 0
    if y.stride(-1) != 1:
        y = y.contiguous()
    y = y[..., : length * stride]
    earlier = torch.matmul(context[..., 0], weight[..., stride:].reshape(cin, cout * stride))
    y[..., :stride] += earlier.view(batch, cout, stride)
    # Without a bias y is final already: the pass then only writes the Snake.
    activated = _bias_residual_(y, bias, None, snake, keep=bias is not None) if bias is not None or snake else None
    return y, activated


def causal_conv_transpose(
    x: torch.Tensor, context: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int
) -> torch.Tensor:
    done = _causal_transpose(x, context, weight, bias, stride, None)
    if done is None:
        return conv_transpose_crop(torch.cat((context, x), dim=-1), weight, bias, stride, stride, stride)
    return done[0]


def causal_conv_transpose_snake(
    x: torch.Tensor,
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int,
    alpha: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    done = _causal_transpose(x, context, weight, bias, stride, (alpha, None))
    if done is None or done[1] is None:
        return causal_conv_transpose_snake_torch(x, context, weight, bias, stride, alpha)
    return done[0], done[1]


# The depthwise conv's ALIGN at most (benchmarks/vae_bench.py --dwconv-align weighs it): its taps but the last are
# shifted by frames that ALIGN does not divide, and where Triton gives a thread ALIGN adjacent frames such a tap
# becomes ALIGN 16-bit loads, each a strided access. VoxCPM2's 18 convs at B=1,024 on an H200 (h200-2026-12-02, call
# 2) summed 10.91 ms at 1 (no hint), 8.71 at 2, 8.02 at 4 and 10.23 at 8; at 4 the long rows move ~1.9 TB/s.
DWCONV_ALIGN = 4


@triton.jit
def _dwconv_taps(x_row, ctx_row, w_ptr, c, t, mask, K: tl.constexpr, DIL: tl.constexpr, CONTEXT: tl.constexpr):
    """A tile's depthwise conv, summed in fp32 over the K taps. With CONTEXT (a tile that starts within the causal
    context) frames before 0 come from the context; the other tiles, nearly all of them, load x alone."""
    CTX: tl.constexpr = (K - 1) * DIL
    acc = tl.zeros(mask.shape, dtype=tl.float32)
    for k in tl.static_range(K):
        i = (t + (k * DIL - CTX))[None, :]  # input frame of tap k
        if CONTEXT:
            xv = tl.load(x_row + i, mask=mask & (i >= 0), other=0.0)
            cv = tl.load(ctx_row + CTX + i, mask=mask & (i < 0), other=0.0)
            v = tl.where(i >= 0, xv, cv)
        else:
            v = tl.load(x_row + i, mask=mask, other=0.0)
        acc += tl.load(w_ptr + c * K + k).to(tl.float32)[:, None] * v.to(tl.float32)
    return acc


@triton.jit(do_not_specialize=["n_rows", "length", "channels", "x_sb", "x_sc", "c_sb", "c_sc"])
def _dwconv_snake_kernel(
    x_ptr, ctx_ptr, w_ptr, bias_ptr, alpha_ptr, out_ptr, n_rows, length, channels, x_sb, x_sc, c_sb, c_sc,
    K: tl.constexpr, DIL: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    b, c, t, mask, out_at = _row_tile(n_rows, length, channels, ROWS, BLOCK, ALIGN)
    x_row = x_ptr + (b * _aligned(x_sb, ALIGN) + c * _aligned(x_sc, ALIGN))[:, None]
    ctx_row = ctx_ptr + (b * c_sb + c * c_sc)[:, None]
    if tl.program_id(1) * BLOCK < (K - 1) * DIL:
        acc = _dwconv_taps(x_row, ctx_row, w_ptr, c, t, mask, K, DIL, True)
    else:
        acc = _dwconv_taps(x_row, ctx_row, w_ptr, c, t, mask, K, DIL, False)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c).to(tl.float32)[:, None]
    y = acc.to(out_ptr.dtype.element_ty).to(tl.float32)  # the conv's output rounding, as in the twin
    alpha = tl.load(alpha_ptr + c).to(tl.float32)[:, None]
    tl.store(out_ptr + out_at, _snake(y, alpha).to(out_ptr.dtype.element_ty), mask=mask)


def causal_conv_snake(
    x: torch.Tensor,
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    alpha: torch.Tensor,
) -> torch.Tensor:
    batch, channels, length = x.shape
    kernel = weight.shape[-1]
    ok = (
        weight.shape == (channels, 1, kernel)  # depthwise
        and context.shape == (batch, channels, (kernel - 1) * dilation)
        and x.stride(-1) == 1
        and context.stride(-1) == 1
        and alpha.numel() == channels
        and all(t.dtype == x.dtype for t in (context, weight, alpha, *([bias] if bias is not None else [])))
    )
    if not ok:
        return causal_conv_snake_torch(x, context, weight, bias, dilation, alpha)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        grid, rows, block, align = _row_tiles(batch * channels, length, x.stride(0), x.stride(1))
        _dwconv_snake_kernel[grid](
            x, context, weight.contiguous(), bias if bias is not None else weight, alpha.contiguous(), out,
            batch * channels, length, channels, x.stride(0), x.stride(1), context.stride(0), context.stride(1),
            K=kernel, DIL=dilation, HAS_BIAS=bias is not None, ROWS=rows, BLOCK=block, ALIGN=min(align, DWCONV_ALIGN),
            num_warps=4,
        )  # fmt: skip
    return out


# One program per (batch row, block of time) computes all COUT outputs, summing over every input channel and tap
# in fp32; the context frames are read where they lie (no concatenation).
@triton.jit(do_not_specialize=["length", "channels", "x_sb", "x_sc", "c_sb", "c_sc"])
def _causal_conv_kernel(
    x_ptr, ctx_ptr, w_ptr, bias_ptr, out_ptr, length, channels, x_sb, x_sc, c_sb, c_sc,
    K: tl.constexpr, DIL: tl.constexpr, COUT: tl.constexpr, COUT_P: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    CTX: tl.constexpr = (K - 1) * DIL
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = t < length
    o = tl.arange(0, COUT_P)
    acc = tl.zeros([COUT_P, BLOCK], dtype=tl.float32)
    for c in range(0, channels):
        x_row = x_ptr + b * x_sb + c * x_sc
        ctx_row = ctx_ptr + b * c_sb + c * c_sc
        for k in tl.static_range(K):
            i = t + (k * DIL - CTX)  # input frame of tap k; frames before 0 come from the context
            xv = tl.load(x_row + i, mask=mask & (i >= 0), other=0.0)
            cv = tl.load(ctx_row + CTX + i, mask=mask & (i < 0), other=0.0)
            w = tl.load(w_ptr + o * (channels * K) + c * K + k, mask=o < COUT, other=0.0).to(tl.float32)
            acc += w[:, None] * tl.where(i >= 0, xv, cv).to(tl.float32)[None, :]
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    y = acc.to(dtype)  # the conv's output rounding; PyTorch's cuDNN conv adds its bias in a pass of its own
    if HAS_BIAS:
        y = (y.to(tl.float32) + tl.load(bias_ptr + o, mask=o < COUT, other=0.0).to(tl.float32)[:, None]).to(dtype)
    out_at = out_ptr + b * (COUT * length) + o[:, None] * length + t[None, :]
    tl.store(out_at, y, mask=(o < COUT)[:, None] & mask[None, :])


# Output channels the kernel covers: it recomputes nothing per channel, so its work grows with COUT * C * K.
_MAX_CONV_OUT = 4


def causal_conv(
    x: torch.Tensor, context: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int
) -> torch.Tensor:
    batch, channels, length = x.shape
    cout, kernel = weight.shape[0], weight.shape[-1]
    ok = (
        weight.shape == (cout, channels, kernel)  # groups = 1
        and cout <= _MAX_CONV_OUT
        and context.shape == (batch, channels, (kernel - 1) * dilation)
        and x.stride(-1) == 1
        and context.stride(-1) == 1
        and all(t.dtype == x.dtype for t in (context, weight, *([bias] if bias is not None else [])))
    )
    if not ok:
        return causal_conv_torch(x, context, weight, bias, dilation)
    out = torch.empty(batch, cout, length, dtype=x.dtype, device=x.device)
    if out.numel():
        block = min(1024, max(16, triton.next_power_of_2(length)))
        _causal_conv_kernel[(batch, triton.cdiv(length, block))](
            x, context, weight.contiguous(), bias if bias is not None else weight, out,
            length, channels, x.stride(0), x.stride(1), context.stride(0), context.stride(1),
            K=kernel, DIL=dilation, COUT=cout, COUT_P=max(2, triton.next_power_of_2(cout)), HAS_BIAS=bias is not None,
            BLOCK=block, num_warps=4,
        )  # fmt: skip
    return out


# -- The CFM solver's guidance and Euler update ---------------------------------------------------------------------


@triton.jit
def _round(v, dtype: tl.constexpr):
    """fp32 v rounded to dtype and back: where the twin's op stores its result."""
    return v.to(dtype).to(tl.float32)


@triton.jit
def _guided_euler_kernel(x_ptr, vc_ptr, vu_ptr, cfg_ptr, dt_ptr, frozen_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dtype: tl.constexpr = x_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    vc = tl.load(vc_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    vu = tl.load(vu_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    dot = _round(tl.sum(_round(vc * vu, dtype), axis=0), dtype)
    norm = _round(tl.sum(_round(vu * vu, dtype), axis=0), dtype)
    scale = _round(dot / _round(norm + 1e-8, dtype), dtype)
    vu_scaled = _round(vu * scale, dtype)
    guided = _round(tl.load(cfg_ptr + row) * _round(vc - vu_scaled, dtype), dtype)
    v = _round(vu_scaled + guided, dtype)
    v = tl.where(tl.load(frozen_ptr + row) != 0, 0.0, v)
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    step = _round(tl.load(dt_ptr + row).to(tl.float32) * v, dtype)
    tl.store(x_ptr + row * n + cols, (x - step).to(dtype), mask=mask)


def guided_euler_(
    x: torch.Tensor, v_c: torch.Tensor, v_u: torch.Tensor, cfg: torch.Tensor, dt: torch.Tensor, frozen: torch.Tensor
) -> None:
    batch = x.shape[0]
    ok = (
        all(t.is_contiguous() and t.shape == x.shape and t.dtype == x.dtype for t in (v_c, v_u))
        and x.is_contiguous()
        and cfg.dtype == torch.float32
        and dt.dtype == x.dtype
        and frozen.dtype == torch.bool
        and all(t.shape == (batch,) and t.is_contiguous() for t in (cfg, dt, frozen))
    )
    if not ok:
        guided_euler_torch_(x, v_c, v_u, cfg, dt, frozen)
        return
    n = x[0].numel() if batch else 0
    if batch and n:
        _guided_euler_kernel[(batch,)](x, v_c, v_u, cfg, dt, frozen, n, BLOCK=triton.next_power_of_2(n))


# -- Dense attention over tiny rows (LocDiT / LocEnc) ------------------------------------------------------------


@triton.jit(do_not_specialize=["q_sb", "q_ss", "k_sb", "k_ss", "v_sb", "v_ss"])
def _dense_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, scale, q_sb, q_ss, k_sb, k_ss, v_sb, v_ss,
    S: tl.constexpr, S_P: tl.constexpr, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """One program per (row, kv head): its G query heads x S positions form one [G*S_P, D] tile against the
    head's [S_P, D] keys and values; softmax in fp32, P rounded to the input dtype for the PV product (as
    flash-attn does)."""
    q_sb, q_ss, k_sb, k_ss = _aligned(q_sb, ALIGN), _aligned(q_ss, ALIGN), _aligned(k_sb, ALIGN), _aligned(k_ss, ALIGN)
    v_sb, v_ss = _aligned(v_sb, ALIGN), _aligned(v_ss, ALIGN)
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    m = tl.arange(0, G * S_P)
    pos, head = m % S_P, kv_head * G + m // S_P
    d = tl.arange(0, D)
    j = tl.arange(0, S_P)
    q_mask = (pos < S)[:, None]
    q = tl.load(q_ptr + b * q_sb + pos[:, None] * q_ss + head[:, None] * D + d[None, :], mask=q_mask, other=0.0)
    kv_mask = (j < S)[:, None]
    k = tl.load(k_ptr + b * k_sb + j[:, None] * k_ss + kv_head * D + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + b * v_sb + j[:, None] * v_ss + kv_head * D + d[None, :], mask=kv_mask, other=0.0)
    scores = tl.dot(q, tl.trans(k)) * scale
    scores = tl.where((j < S)[None, :], scores, float("-inf"))
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    out = tl.dot(p.to(v.dtype), v) / tl.sum(p, axis=1)[:, None]
    o_row = o_ptr + b * (S * H * D)  # the output is a fresh contiguous [B, S, H, D]
    o_offsets = pos[:, None] * (H * D) + head[:, None] * D + d[None, :]
    tl.store(o_row + o_offsets, out.to(o_ptr.dtype.element_ty), mask=q_mask)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    batch, seq, heads, dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads if kv_heads else 0
    ok = (
        seq <= MAX_TINY_SEQ
        and q.dtype in (torch.float16, torch.bfloat16)
        and k.dtype == q.dtype == v.dtype
        and k.shape == v.shape == (batch, seq, kv_heads, dim)
        and group * kv_heads == heads
        and group == triton.next_power_of_2(group)
        and 16 <= dim == triton.next_power_of_2(dim)
        and all(t.stride(-1) == 1 and t.stride(-2) == dim for t in (q, k, v))
    )
    if not ok:
        return dense_attention_torch(q, k, v, scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch:
        seq_p = max(16, triton.next_power_of_2(seq))
        warps = _attention_warps(group * seq_p * dim, batch * kv_heads)
        _dense_attention_kernel[(batch, kv_heads)](
            q, k, v, out, scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            S=seq, S_P=seq_p, H=heads, G=group, D=dim, num_warps=warps,
            ALIGN=_alignment(*q.stride()[:2], *k.stride()[:2], *v.stride()[:2]),
        )  # fmt: skip
    return out


def _attention_warps(tile: int, programs: int) -> int:
    """Warps of the tiny-row attention kernels for a [G * S_P, D] tile of `tile` elements."""
    return 4 if tile <= 128 * 64 or (tile <= 128 * 128 and programs >= MANY_PROGRAMS) else 8


@triton.jit
def _rotated(base, pos, ok, cos_ptr, sin_ptr, D: tl.constexpr):
    """Heads at base[i] [rows, D] (positions pos[i]) rotated as rope_torch rotates them (fp32, rounded back to the
    input dtype, as rope_qk stores them), as (first halves, second halves) [rows, D / 2]; rows not `ok` are zeros.
    The tables' rows repeat their first half (rotate-half RoPE: see rope_attention_fits), so only that half is read:
    the table loads were two thirds of the kernel's loads, every (head, position) reading its position's row."""
    half = tl.arange(0, D // 2)[None, :]
    at = pos[:, None] * D + half
    x1 = tl.load(base + half, mask=ok, other=0.0)
    x2 = tl.load(base + D // 2 + half, mask=ok, other=0.0)
    cos = tl.load(cos_ptr + at, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + at, mask=ok, other=0.0).to(tl.float32)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    return (x1f * cos - x2f * sin).to(x1.dtype), (x2f * cos + x1f * sin).to(x1.dtype)


@triton.jit(do_not_specialize=["q_sb", "q_ss", "k_sb", "k_ss", "v_sb", "v_ss"])
def _rope_attention_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, o_ptr, s_ptr, scale, q_sb, q_ss, k_sb, k_ss, v_sb, v_ss,
    S: tl.constexpr, S_P: tl.constexpr, KEEP: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr,
    HKV_P: tl.constexpr, G: tl.constexpr, GB: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """_dense_attention_kernel's tiles (one program per (row, kv head, block of GB of its G query heads): those heads
    x S positions against the kv head's keys and values), q and k rotated as they are loaded, and only the row's last
    KEEP positions written, as rows b * KEEP + i of o [B * KEEP, H * D]: in the input dtype, or with FP8 as e4m3
    scaled by the row's bound (s [B * KEEP]; bounded_fp8_rows_torch, whose IEEE roundings these repeat), which is
    known before any output is."""
    q_sb, q_ss, k_sb, k_ss = _aligned(q_sb, ALIGN), _aligned(q_ss, ALIGN), _aligned(k_sb, ALIGN), _aligned(k_ss, ALIGN)
    v_sb, v_ss = _aligned(v_sb, ALIGN), _aligned(v_ss, ALIGN)
    b = tl.program_id(0).to(tl.int64)
    kv_head, head_block = tl.program_id(1), tl.program_id(2)
    m = tl.arange(0, GB * S_P)
    pos, head = m % S_P, kv_head * G + head_block * GB + m // S_P
    j = tl.arange(0, S_P)
    d = tl.arange(0, D)[None, :]
    q_ok, kv_ok = (pos < S)[:, None], (j < S)[:, None]
    q_at = q_ptr + b * q_sb + pos[:, None] * q_ss + head[:, None] * D
    k_at = k_ptr + b * k_sb + j[:, None] * k_ss + kv_head * D
    v = tl.load(v_ptr + b * v_sb + j[:, None] * v_ss + kv_head * D + d, mask=kv_ok, other=0.0)
    q1, q2 = _rotated(q_at, pos, q_ok, cos_ptr, sin_ptr, D)
    k1, k2 = _rotated(k_at, j, kv_ok, cos_ptr, sin_ptr, D)
    scores = tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))
    scores = tl.where((j < S)[None, :], scores * scale, float("-inf"))
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    out = (tl.dot(p.to(v.dtype), v) / tl.sum(p, axis=1)[:, None]).to(v.dtype)
    kept = ((pos >= S - KEEP) & (pos < S))[:, None]
    o_at = o_ptr + (b * KEEP + pos - (S - KEEP))[:, None] * (H * D) + head[:, None] * D + d
    if FP8:
        f = tl.arange(0, HKV_P * D)[None, :]
        v_all = tl.load(v_ptr + b * v_sb + j[:, None] * v_ss + f, mask=kv_ok & (f < HKV * D), other=0.0)
        bound = tl.max(tl.max(tl.abs(v_all.to(tl.float32)), axis=1), axis=0)
        row_scale = tl.maximum(bound, _FP8_MIN_AMAX) * _FP8_INVERSE_MAX
        inverse = tl.div_rn(1.0, row_scale)
        q8 = tl.clamp(out.to(tl.float32) * inverse, -_FP8_MAX, _FP8_MAX).to(o_ptr.dtype.element_ty)
        tl.store(o_at, q8, mask=kept)
        if kv_head == 0 and head_block == 0:
            scale_ok = (j >= S - KEEP) & (j < S)
            tl.store(s_ptr + b * KEEP + j - (S - KEEP), tl.zeros([S_P], tl.float32) + row_scale, mask=scale_ok)
    else:
        tl.store(o_at, out, mask=kept)


def rope_attention_fits(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> bool:
    """Whether the fused kernel takes these operands (as Attention.forward has them: views of one qkv GEMM output,
    tables [S, 1, D] in q's dtype); kernels.rope_attention runs the passes it fuses otherwise. The kernel reads each
    table row's first half only: the tables must be rotate-half RoPE's, cat(freqs, freqs) (every stack that reaches
    it builds them so: minicpm4.LongRoPE, which checks it), a property not tested here (a device-side compare)."""
    batch, seq, heads, dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads if kv_heads else 0
    return (
        seq <= MAX_TINY_SEQ
        and q.dtype in (torch.float16, torch.bfloat16)
        and k.dtype == q.dtype == v.dtype
        and k.shape == v.shape == (batch, seq, kv_heads, dim)
        and group * kv_heads == heads
        and group == triton.next_power_of_2(group)
        and 32 <= dim == triton.next_power_of_2(dim)  # a half head is tl.dot's K: at least 16
        and all(t.stride(-1) == 1 and t.stride(-2) == dim for t in (q, k, v))
        and all(t.shape[0] == seq and t.is_contiguous() and t.dtype == q.dtype for t in (cos, sin))
    )


def rope_attention_pays(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the fused kernel beats rope_qk + dense_attention without FP8 rows to write: on grids of MANY_PROGRAMS
    programs or more (VoxCPM2's LocDiT from 512 streams on), where an H200 ran the B=512 engine step (bf16) in 110.1
    ms against 113.3 (benchmarks/results/h200-2026-12-01, call 3). With it at every size, one stream's and eight
    streams' RTF p90 were 2 % and 6 % above the sixteenth session's runs (call 4), so smaller grids keep the two
    kernels."""
    return q.shape[0] * k.shape[2] >= MANY_PROGRAMS


# (warps, heads a program, max registers) of the fused attention where a kv head a row makes MANY_PROGRAMS programs or
# more: the best of the 18 launches rope_attention_bench --sweep weighs, at B=1,024's LocDiT shapes on an H200 (FP8
# rows, 11 positions; h200-2026-12-02b, call 1, reading half of each RoPE table row): 0.0921 ms a call, a kv head's 8
# queries over two programs, against 0.1068 for the best launch of the whole group (8 warps, 96 registers) and 0.0999
# for ptxas's own allocation (bf16: 0.0938, 0.1039, 0.0998).
ROPE_ATTENTION_LARGE_GRID = (4, 4, 96)


def rope_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float, keep: int,
    fp8: bool, warps: int | None = None, heads_per_program: int | None = None, max_registers: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """kernels.rope_attention_torch for operands rope_attention_fits lets through. `warps` and `max_registers`
    (benchmarks sweep them, with `heads_per_program`): by default ROPE_ATTENTION_LARGE_GRID on large grids, else
    dense_attention's warps for the tile and ptxas's own allocation.
    `heads_per_program` (a power of two dividing the group; by default the whole group, each kv head's queries in one
    program): smaller blocks make smaller tiles and more programs, for the benchmark to weigh against the kv head's
    loads each block repeats. `max_registers` (ptxas's maxnreg) trades spills for programs an SM. ptxas (sm_90a,
    VoxCPM2's LocDiT shapes, FP8 rows, the strides hinted aligned, half table rows) gives the whole group at 4 warps
    217 registers, two programs an SM; half the group 102, and 96 under ROPE_ATTENTION_LARGE_GRID's cap, none
    spilled, five programs an SM (reading whole table rows: 255 with 108 bytes spilled, 159, and 96 with 312 spilled).
    At B=1,024 the kernel moves ~1.75 TB/s (~0.65 before its strides were hinted
    aligned, ~1.2 before it read half table rows: h200-2026-12-02, calls 1 and 3; h200-2026-12-02b, call 1)."""
    batch, seq, heads, dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    if (warps, heads_per_program, max_registers) == (None, None, None) and batch * kv_heads >= MANY_PROGRAMS:
        warps, heads_per_program, max_registers = ROPE_ATTENTION_LARGE_GRID
        heads_per_program = min(heads_per_program, group)
    block = heads_per_program or group
    assert group % block == 0 and block == triton.next_power_of_2(block), (group, block)
    out = torch.empty(batch, keep, heads * dim, device=q.device, dtype=torch.float8_e4m3fn if fp8 else q.dtype)
    row_scale = torch.empty(batch, keep, 1, device=q.device, dtype=torch.float32) if fp8 else out
    if batch:
        seq_p, programs = max(16, triton.next_power_of_2(seq)), batch * kv_heads * (group // block)
        _rope_attention_kernel[(batch, kv_heads, group // block)](
            q, k, v, cos, sin, out, row_scale, scale,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            S=seq, S_P=seq_p, KEEP=keep, H=heads, HKV=kv_heads, HKV_P=triton.next_power_of_2(kv_heads), G=group,
            GB=block, D=dim, FP8=fp8, ALIGN=_alignment(*q.stride()[:2], *k.stride()[:2], *v.stride()[:2]),
            num_warps=warps or _attention_warps(block * seq_p * dim, programs),
            **({"maxnreg": max_registers} if max_registers else {}),
        )  # fmt: skip
    return (out, row_scale) if fp8 else out


# -- LoRA: each row's own adapter slot (rows grouped by slot, then segmented shrink and expand) -------------------
# Punica's SGMV layout: one plan per row layout (`lora_rows`, one program) lists the rows slot by slot; the shrink and
# expand grids then cover tiles of BLOCK_M grouped rows, each tile within one slot's segment, so every row is read
# once with its own slot's A and B. The grids are an upper bound on the tiles (cdiv(M, BLOCK_M) + S - 1): shapes
# never depend on the mix (capturable), and the programs past the last tile return at once.


@triton.jit(do_not_specialize=["M"])
def _lora_plan_kernel(idx_ptr, order_ptr, seg_ptr, M, S: tl.constexpr, S_P: tl.constexpr, BLOCK: tl.constexpr):
    """One program: count each slot's rows, then place every row of slots 1..S-1 after the earlier rows of its slot
    (a stable counting sort). Slot 0 and out-of-range values are not placed: no program reads those rows."""
    slots = tl.arange(0, S_P)
    live = (slots >= 1) & (slots < S)
    counts = tl.zeros([S_P], dtype=tl.int32)
    for m0 in range(0, M, BLOCK):
        rows = m0 + tl.arange(0, BLOCK)
        idx = tl.load(idx_ptr + rows, mask=rows < M, other=0)
        counts += tl.sum(((idx[:, None] == slots[None, :]) & live[None, :]).to(tl.int32), axis=0)
    starts = tl.cumsum(counts, axis=0) - counts
    tl.store(seg_ptr + slots, starts, mask=slots < S)
    tl.store(seg_ptr + S, tl.sum(counts, axis=0))
    for m0 in range(0, M, BLOCK):
        rows = m0 + tl.arange(0, BLOCK)
        idx = tl.load(idx_ptr + rows, mask=rows < M, other=0)
        hit = ((idx[:, None] == slots[None, :]) & live[None, :]).to(tl.int32)
        earlier = tl.cumsum(hit, axis=0) - hit  # rows of the same slot before this one in the block
        pos = tl.sum((starts[None, :] + earlier) * hit, axis=1)
        tl.store(order_ptr + pos, rows, mask=tl.sum(hit, axis=1) > 0)
        starts += tl.sum(hit, axis=0)


@triton.jit
def _lora_tile(seg_ptr, tile, S: tl.constexpr, S_P: tl.constexpr, BLOCK_M: tl.constexpr):
    """(slot, first, end) of row tile `tile`: the tiles of BLOCK_M grouped rows are laid out slot after slot, the
    tile holds order[first:min(first + BLOCK_M, end)]; slot 0 for a program past the last tile."""
    slots = tl.arange(0, S_P)
    live = (slots >= 1) & (slots < S)
    start = tl.load(seg_ptr + slots, mask=live, other=0)
    end = tl.load(seg_ptr + slots + 1, mask=live, other=0)
    tiles = (end - start + BLOCK_M - 1) // BLOCK_M
    before = tl.cumsum(tiles, axis=0) - tiles
    mine = (tile >= before) & (tile < before + tiles)  # at most one slot: the tile ranges do not overlap
    slot = tl.sum(tl.where(mine, slots, 0), axis=0)
    first = tl.sum(tl.where(mine, start + (tile - before) * BLOCK_M, 0), axis=0)
    return slot, first, tl.sum(tl.where(mine, end, 0), axis=0)


@triton.jit
def _lora_shrink_kernel(
    x_ptr, order_ptr, seg_ptr, a_ptr, t_ptr, K, R, stride_x,
    S: tl.constexpr, S_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """t[p, r-block] = x[order[p]] @ A[slot, r-block].T for the grouped positions p of one tile (t in grouped order)."""
    slot, first, end = _lora_tile(seg_ptr, tl.program_id(0), S, S_P, BLOCK_M)
    if slot == 0:
        return
    pos = first + tl.arange(0, BLOCK_M)
    live = pos < end
    rows = tl.load(order_ptr + pos, mask=live, other=0).to(tl.int64)
    rs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    a_base = a_ptr + slot.to(tl.int64) * R * K
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=live[:, None] & (ks < K)[None, :], other=0.0)
        a = tl.load(a_base + rs[None, :] * K + ks[:, None], mask=(rs < R)[None, :] & (ks < K)[:, None], other=0.0)
        acc += tl.dot(x, a, input_precision=PRECISION)
    # Rounded to the activations' dtype: where the reference's first F.linear rounds.
    t_offsets = pos[:, None].to(tl.int64) * R + rs[None, :]
    tl.store(t_ptr + t_offsets, acc.to(t_ptr.dtype.element_ty), mask=live[:, None] & (rs < R)[None, :])


@triton.jit
def _lora_expand_kernel(
    t_ptr, order_ptr, seg_ptr, b_ptr, y_ptr, N, R, stride_y,
    S: tl.constexpr, S_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """y[order[p], n-block] += t[p] @ B[slot][:, n-block] for the grouped positions p of one tile."""
    slot, first, end = _lora_tile(seg_ptr, tl.program_id(0), S, S_P, BLOCK_M)
    if slot == 0:
        return
    pos = first + tl.arange(0, BLOCK_M)
    live = pos < end
    rows = tl.load(order_ptr + pos, mask=live, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    b_base = b_ptr + slot.to(tl.int64) * R * N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rs = r0 + tl.arange(0, BLOCK_R)
        t_mask = live[:, None] & (rs < R)[None, :]
        t = tl.load(t_ptr + pos[:, None].to(tl.int64) * R + rs[None, :], mask=t_mask, other=0.0)
        b = tl.load(b_base + rs[:, None] * N + cols[None, :], mask=(rs < R)[:, None] & (cols < N)[None, :], other=0.0)
        acc += tl.dot(t, b, input_precision=PRECISION)
    y_mask = live[:, None] & (cols < N)[None, :]
    y_offsets = rows[:, None] * stride_y + cols[None, :]
    y = tl.load(y_ptr + y_offsets, mask=y_mask, other=0.0)
    # The reference adds its rounded update to the rounded base output: round the update first, then add.
    update = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + y_offsets, (y.to(tl.float32) + update).to(y_ptr.dtype.element_ty), mask=y_mask)


def lora_rows(index: torch.Tensor, slots: int) -> LoRARows:
    index = index.contiguous()
    rows = index.numel()
    order = torch.empty(rows, dtype=torch.int32, device=index.device)
    segments = torch.empty(slots + 1, dtype=torch.int32, device=index.device)
    s_p = max(16, triton.next_power_of_2(slots))
    # One program holds a [BLOCK, S_P] one-hot matrix: 16K entries whatever the pool size.
    _lora_plan_kernel[(1,)](index, order, segments, rows, S=slots, S_P=s_p, BLOCK=max(64, 16384 // s_p), num_warps=8)
    return LoRARows(index, order, segments)


# BLOCK_M of the shrink and of the expand. Fixed, not chosen by the row count: a new value would compile a new variant
# the first time a batch size needs it (a stall mid-serve). The shrink walks K = in_features per tile and is read-
# bound on x and A: 32-row tiles keep a LocDiT call's 2 x B x 11 rows on several hundred programs. The expand reads
# and writes y: 64-row tiles load each column block of B once per 64 rows; a decode step's LM (B rows, B/8 per slot
# at 8 adapters) leaves some rows of its tiles masked, which costs no memory traffic.
LORA_BLOCKS = (32, 64)


def lora_add_(
    y: torch.Tensor,
    x: torch.Tensor,
    rows: LoRARows,
    a: torch.Tensor,
    b: torch.Tensor,
    blocks: tuple[int, int] = LORA_BLOCKS,
) -> None:
    """`blocks`: (shrink, expand) BLOCK_M (an argument for benchmarks)."""
    m, k = x.shape
    slots, rank, n = b.shape
    index = rows.index
    ok = (
        x.dtype == y.dtype == a.dtype == b.dtype
        and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and x.stride(1) == 1 and y.stride(1) == 1 and a.is_contiguous() and b.is_contiguous()
        and y.shape == (m, n) and a.shape == (slots, rank, k) and index.shape == (m,)
    )  # fmt: skip
    if not ok:
        lora_add_torch(y, x, index, a, b)
        return
    if m == 0 or slots < 2:
        return
    if rows.order is None or rows.segments is None or rows.segments.numel() != slots + 1:
        rows = lora_rows(index, slots)
    block_shrink, block_expand = blocks
    block_r = max(16, min(32, triton.next_power_of_2(rank)))  # a fused q/k/v's parts are separate programs
    block_k = max(16, min(128, triton.next_power_of_2(k)))
    block_n = max(16, min(128, triton.next_power_of_2(n)))
    s_p = max(16, triton.next_power_of_2(slots))
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 exact like the twin; 16-bit ignores it
    shrunk = torch.empty(m, rank, dtype=x.dtype, device=x.device)
    _lora_shrink_kernel[(triton.cdiv(m, block_shrink) + slots - 1, triton.cdiv(rank, block_r))](
        x, rows.order, rows.segments, a, shrunk, k, rank, x.stride(0),
        S=slots, S_P=s_p, BLOCK_M=block_shrink, BLOCK_K=block_k, BLOCK_R=block_r, PRECISION=precision, num_warps=4,
    )  # fmt: skip
    _lora_expand_kernel[(triton.cdiv(m, block_expand) + slots - 1, triton.cdiv(n, block_n))](
        shrunk, rows.order, rows.segments, b, y, n, rank, y.stride(0),
        S=slots, S_P=s_p, BLOCK_M=block_expand, BLOCK_N=block_n, BLOCK_R=block_r, PRECISION=precision, num_warps=4,
    )  # fmt: skip
