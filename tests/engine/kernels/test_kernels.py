"""engine.kernels on the CPU: dispatch runs the torch twins (the numerics every parity test checks)."""

from __future__ import annotations

import torch

from engine import kernels


def test_cpu_dispatch_is_the_twin() -> None:
    gen = torch.Generator().manual_seed(0)
    x, update = torch.randn(2, 3, 16, generator=gen), torch.randn(2, 3, 16, generator=gen)
    weight = torch.rand(16, generator=gen)
    assert torch.equal(kernels.rms_norm(x, weight, 1e-5), kernels.rms_norm_torch(x, weight, 1e-5))
    summed, normed = kernels.add_rms_norm(x, update, weight, 1e-5)
    assert torch.equal(summed, x + update)
    assert torch.equal(normed, kernels.rms_norm_torch(x + update, weight, 1e-5))
    gate_up = torch.randn(5, 32, generator=gen)
    assert torch.equal(kernels.silu_mul(gate_up), torch.nn.functional.silu(gate_up[:, :16]) * gate_up[:, 16:])
    rows, weight_2n = torch.randn(3, 16, generator=gen), torch.randn(32, 16, generator=gen)
    assert torch.equal(kernels.linear(rows, weight_2n), torch.nn.functional.linear(rows, weight_2n))
    product = torch.nn.functional.linear(rows, weight_2n)
    assert torch.equal(kernels.gate_up_silu(rows, weight_2n), kernels.silu_mul_torch(product))
    alpha = torch.rand(1, 3, 1, generator=gen) + 0.5
    assert torch.equal(kernels.snake(x, alpha), kernels.snake_torch(x, alpha))
    scale, shift = torch.rand(1, 3, 1, generator=gen) + 0.5, torch.randn(1, 3, 1, generator=gen)
    assert torch.equal(kernels.snake(x, alpha, (scale, shift)), kernels.snake_torch(x * scale + shift, alpha))
    h, pointwise = torch.randn(2, 5, 16, generator=gen), torch.randn(3, 5, 1, generator=gen)
    bias = torch.randn(3, generator=gen)
    summed = kernels.pointwise_residual(h, pointwise, bias, x)
    assert torch.equal(summed, x + torch.nn.functional.conv1d(h, pointwise, bias))
    up = kernels.conv_transpose_crop(h, torch.randn(5, 3, 4, generator=gen), bias, 2, 2, 1)
    assert up.shape == (2, 3, 2 * 17 - 3)
    moved, v = x.clone(), torch.randn(4, 3, 16, generator=gen)
    kernels.guided_euler_(moved, v[:2], v[2:], torch.ones(2), torch.full((2,), 0.5), torch.tensor([False, True]))
    assert torch.equal(moved[1], x[1]) and torch.allclose(moved[0], x[0] - 0.5 * v[0])  # cfg 1: the conditional v
    q, k = torch.randn(2, 5, 4, 16, generator=gen), torch.randn(2, 5, 2, 16, generator=gen)
    assert torch.equal(kernels.dense_attention(q, k, k, 0.25), kernels.dense_attention_torch(q, k, k, 0.25))
    context, weight = torch.randn(2, 3, 12, generator=gen), torch.randn(3, 1, 7, generator=gen)
    conv = kernels.causal_conv_snake(x, context, weight, None, 2, alpha)
    assert torch.equal(conv, kernels.causal_conv_snake_torch(x, context, weight, None, 2, alpha))


def test_causal_conv_snake_twin_is_the_reference_chain() -> None:
    """conv over [context | x] then Snake, i.e. what the VAE's Snake -> padded conv -> Snake chain computes."""
    gen = torch.Generator().manual_seed(1)
    x, context = torch.randn(2, 4, 9, generator=gen), torch.randn(2, 4, 6, generator=gen)
    weight, bias = torch.randn(4, 1, 7, generator=gen), torch.randn(4, generator=gen)
    alpha = torch.rand(1, 4, 1, generator=gen) + 0.5
    got = kernels.causal_conv_snake_torch(x, context, weight, bias, 1, alpha)
    full = torch.cat((context, x), dim=-1)
    windows = full.unfold(-1, 7, 1)  # [B, C, L, 7]
    conv = (windows * weight[:, 0][None, :, None, :]).sum(-1) + bias[None, :, None]
    torch.testing.assert_close(got, kernels.snake_torch(conv, alpha), rtol=1e-5, atol=1e-5)


def test_causal_conv_transpose_twin_is_two_taps_per_phase() -> None:
    """Sample t*s + j of the streaming upsampling conv is bias + W[:, :, j]^T x[t] + W[:, :, j + s]^T x[t - 1], with
    x[-1] the context frame: what the fused kernel computes, checked on the twin that CPU runs."""
    gen = torch.Generator().manual_seed(2)
    stride, x, context = 3, torch.randn(2, 5, 4, generator=gen), torch.randn(2, 5, 1, generator=gen)
    weight, bias = torch.randn(5, 2, 2 * stride, generator=gen), torch.randn(2, generator=gen)
    got = kernels.causal_conv_transpose(x, context, weight, bias, stride)
    previous = torch.cat((context, x[..., :-1]), dim=-1)
    phases = [
        torch.einsum("co,bct->bot", weight[:, :, j], x)
        + torch.einsum("co,bct->bot", weight[:, :, j + stride], previous)
        for j in range(stride)
    ]
    expected = torch.stack(phases, dim=-1).flatten(-2) + bias[None, :, None]
    assert got.shape == (2, 2, 4 * stride)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_rope_twin_rotates_pairs_half_a_head_apart() -> None:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x2, x1): checked on one explicit pair."""
    q, k = torch.zeros(1, 2, 4), torch.zeros(1, 1, 4)
    q[0, 1, 0], q[0, 1, 2] = 1.0, 2.0  # head 1, dims 0 and 2 form a pair
    angle = torch.tensor(0.3)
    cos = torch.full((1, 1, 4), float(angle.cos()))
    sin = torch.full((1, 1, 4), float(angle.sin()))
    q_rot, k_rot = kernels.rope_qk(q, k, cos, sin)
    c, s = float(angle.cos()), float(angle.sin())
    torch.testing.assert_close(q_rot[0, 1, [0, 2]], torch.tensor([1 * c - 2 * s, 2 * c + 1 * s]))
    assert not q_rot[0, 0].any() and not k_rot.any()


def test_fused_enabled_restores_the_previous_setting() -> None:
    with kernels.fused_enabled(False):
        assert not kernels._enabled
        with kernels.fused_enabled(True):
            assert kernels._enabled
        assert not kernels._enabled
    assert kernels._enabled


def test_lora_twin_applies_each_rows_slot() -> None:
    """Each row gets its own slot's (x A^T) B, slot 0 rows get nothing, other rows' slots never leak in."""
    gen = torch.Generator().manual_seed(2)
    slots, rank, k, n = 4, 3, 8, 5
    a, b = torch.randn(slots, rank, k, generator=gen), torch.randn(slots, rank, n, generator=gen)
    a[0], b[0] = 0, 0
    x, y = torch.randn(6, k, generator=gen), torch.randn(6, n, generator=gen)
    index = torch.tensor([0, 3, 1, 1, 2, 0], dtype=torch.int32)
    expected = y.clone()
    for m, s in enumerate(index.tolist()):
        expected[m] += (x[m] @ a[s].t()) @ b[s]
    got = y.clone()
    kernels.lora_add_(got, x, kernels.lora_rows(index, slots), a, b)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[0], y[0]) and torch.equal(got[5], y[5])


def test_snake_beta_twin_is_the_reference_in_fp32_and_rounds_once_in_16_bits() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 40, generator=gen) * 8
    log_alpha, log_beta = torch.randn(3, generator=gen) * 0.3, torch.randn(3, generator=gen) * 0.3
    alpha, beta = torch.exp(log_alpha[None, :, None]), torch.exp(log_beta[None, :, None])
    reference = x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)  # qwen-tts' SnakeBeta
    assert torch.equal(kernels.snake_beta(x, log_alpha, log_beta), reference)
    half = x.half()
    got = kernels.snake_beta(half, log_alpha, log_beta)
    assert got.dtype == torch.float16
    assert torch.equal(got, kernels.snake_beta_torch(half.float(), log_alpha, log_beta).half())


def test_qk_norm_rope_twin_is_norm_then_rope() -> None:
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(3, 2, 4, 8, generator=gen), torch.randn(3, 2, 2, 8, generator=gen)
    qw, kw = torch.rand(8, generator=gen) + 0.5, torch.rand(8, generator=gen) + 0.5
    angles = torch.randn(2, 1, 8, generator=gen)
    got = kernels.qk_norm_rope(q, k, qw, kw, 1e-6, angles.cos(), angles.sin())
    for out, x, w in zip(got, (q, k), (qw, kw), strict=True):
        assert torch.equal(out, kernels.rope_torch(kernels.rms_norm_torch(x, w, 1e-6), angles.cos(), angles.sin()))


def test_cached_attention_twin_writes_the_cache_and_is_causal() -> None:
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, h, 8, generator=gen) for h in (4, 2, 2))
    caches = torch.zeros(2, 5, 2, 8), torch.zeros(2, 5, 2, 8)
    out = kernels.cached_attention(q, k, v, caches[0], caches[1], 0, 8**-0.5)
    assert torch.equal(caches[0][:, :2], k) and torch.equal(caches[1][:, :2], v)
    # position 0 sees itself only: its output is its own value row, per query head's KV head
    assert torch.allclose(out[:, 0].view(2, 2, 2, 8), v[:, 0, :, None].expand(2, 2, 2, 8))


def test_block_scaled_fp8_twins() -> None:
    """128x128 weight blocks and 1x128 activation blocks, each scaled to its own amax; the block GEMM is the product
    of the dequantised operands; the gate/up twin is SiLU*mul of the rounded gate/up product, quantised per block."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(256, 384, generator=gen)
    weight[:128, 128:256] *= 1e-3  # a quiet block keeps its own precision
    q, scale = kernels.quantize_blocks_torch(weight)
    assert q.dtype == kernels.FP8 and scale.shape == (2, 3)
    back = q.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert float(((back - weight).abs() / weight.abs().clamp(min=1e-6)).median()) < 1 / 16  # e4m3: 3 mantissa bits
    assert torch.equal(q[:128, 128:256].float().abs().amax(), torch.tensor(kernels.FP8_MAX))

    x = torch.randn(15, 384, generator=gen)
    xq, x_scale = kernels.quantize_rows_torch(x)
    gate_up = torch.randn(1024, 384, generator=gen) / 384**0.5
    wq, w_scale = kernels.quantize_rows_torch(gate_up)
    h, h_scale = kernels.gate_up_silu_fp8_torch(xq, x_scale, wq, w_scale.t(), torch.float32)
    assert h.shape == (15, 512) and h_scale.shape == (15, 4)
    blocks = kernels.silu_mul_torch(kernels.scaled_mm_torch(xq, x_scale, wq, w_scale.t(), torch.float32))
    blocks = blocks.view(15, 4, 128)
    amax = blocks.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(h_scale.view(15, 4, 1), amax / kernels.FP8_MAX)
    assert torch.equal(h.view(15, 4, 128), (blocks / (amax / kernels.FP8_MAX)).to(kernels.FP8))

    down = torch.randn(128, 512, generator=gen)
    dq, d_scale = kernels.quantize_blocks_torch(down)
    dequantised = h.float() * h_scale.repeat_interleave(128, 1)
    expected = dequantised @ (dq.float() * d_scale.repeat_interleave(128, 0).repeat_interleave(128, 1)).t()
    torch.testing.assert_close(kernels.block_scaled_mm_torch(h, h_scale, dq, d_scale, torch.float32), expected)
    bias = torch.randn(128, generator=gen)
    args = (wq, w_scale.t(), dq, d_scale, bias, torch.float32)
    y = kernels.fp8_block_mlp(xq.view(3, 5, 384), x_scale.view(3, 5, 1), *args)  # the CPU dispatch: the twins
    assert y.shape == (3, 5, 128) and torch.equal(y.view(15, 128), expected + bias)
    exact = kernels.silu_mul_torch(x @ gate_up.t()) @ down.t() + bias
    assert float((y.view(15, 128) - exact).norm() / exact.norm()) < 0.1


def _attention_operands(gen: torch.Generator, rows: int, seq: int) -> tuple[torch.Tensor, ...]:
    """q/k/v [rows, seq, heads, 16] and RoPE tables [seq, 1, 16] as a local stack has them."""
    q, k, v = torch.randn(rows, seq, 4, 16, generator=gen), *torch.randn(2, rows, seq, 2, 16, generator=gen)
    angle = torch.randn(seq, 1, 8, generator=gen).repeat(1, 1, 2)
    return q, k, v, angle.cos() * 1.2, angle.sin() * 1.2


def test_rope_attention_off_the_gpu_is_rope_then_the_backends_attention() -> None:
    """The kept positions of rope_torch -> the given dense attention, as rows; with fp8 those rows bound-scaled."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, cos, sin = _attention_operands(gen, 3, 11)
    dense = kernels.dense_attention_torch
    for keep in (11, 4):
        want = dense(kernels.rope_torch(q, cos, sin), kernels.rope_torch(k, cos, sin), v, 0.25)[:, -keep:]
        want = want.reshape(3, keep, 64)
        got = kernels.rope_attention(q, k, v, (cos, sin), 0.25, keep, False, dense)
        assert torch.equal(got, want)
        assert torch.equal(got, kernels.rope_attention_torch(q, k, v, cos, sin, 0.25, keep, False))
        rows, scale = kernels.rope_attention(q, k, v, (cos, sin), 0.25, keep, True, dense)
        twin_rows, twin_scale = kernels.bounded_fp8_rows_torch(want, v)
        assert torch.equal(rows.float(), twin_rows.float()) and torch.equal(scale, twin_scale)
    no_rope = kernels.rope_attention(q, k, v, None, 0.25, 11, False, dense)
    assert torch.equal(no_rope, dense(q, k, v, 0.25).reshape(3, 11, 64))


def test_bounded_fp8_rows_scale_each_row_by_its_values_bound() -> None:
    """One scale per row of the attention (max |v| / 448), shared by its positions; every attention output fits
    (none clamps: all finite e4m3), and dequantised they are as close to the output as quantize_rows' own-amax rows
    are (e4m3's relative step does not depend on the scale), where an output above the bound (P's rounding) clamps
    to 448 instead of turning NaN."""
    gen = torch.Generator().manual_seed(6)
    q, k, v, cos, sin = _attention_operands(gen, 64, 11)
    v[0] = 0  # an all-zero row: the smallest scale, zeros
    v[1] *= 100
    out = kernels.rope_attention_torch(q, k, v, cos, sin, 0.25, 11, False)
    rows, scale = kernels.bounded_fp8_rows_torch(out, v)
    assert rows.dtype == kernels.FP8 and rows.shape == out.shape and scale.shape == (64, 11, 1)
    bound = v.abs().amax(dim=(1, 2, 3))
    torch.testing.assert_close(scale[:, 0, 0], bound.clamp(min=kernels.FP8_MIN_AMAX) / kernels.FP8_MAX)
    assert torch.equal(scale, scale[:, :1].expand_as(scale))
    assert bool(rows.float().isfinite().all()) and float(rows.float().abs().max()) <= kernels.FP8_MAX
    assert not rows[0].float().any()
    error = float((rows[1:].float() * scale[1:] - out[1:]).norm() / out[1:].norm())
    own_q, own_scale = kernels.quantize_rows_torch(out[1:].reshape(-1, 64))
    own_error = float((own_q.float() * own_scale - out[1:].reshape(-1, 64)).norm() / out[1:].norm())
    assert error < 1.25 * own_error < 0.05, (error, own_error)
    over = out[2:3].clone()
    over[0, 0, 0] = bound[2] * 1.01
    clamped, _ = kernels.bounded_fp8_rows_torch(over, v[2:3])
    assert float(clamped[0, 0, 0].float()) == kernels.FP8_MAX
