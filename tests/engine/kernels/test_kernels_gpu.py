"""Triton kernels against their torch twins on CUDA (marker `gpu`): fresh random inputs, poisoned outputs."""

from __future__ import annotations

import pytest
import torch

from engine import kernels

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
triton_ops = pytest.importorskip("engine.kernels.triton_ops")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1024), (37, 11, 1024), (300, 2048), (5, 8)])
def test_rms_norm_and_add_rms_norm(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    update = torch.randn(shape, device="cuda", dtype=dtype)
    weight = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
    assert _rel(triton_ops.rms_norm(x, weight, 1e-5), kernels.rms_norm_torch(x, weight, 1e-5)) < 4e-3
    summed, normed = triton_ops.add_rms_norm(x, update, weight, 1e-5)
    assert torch.equal(summed, x + update)  # the same single rounding as torch's add
    assert _rel(normed, kernels.rms_norm_torch(x + update, weight, 1e-5)) < 4e-3


# One VoxCPM2 stream's GEMMs (K, N): the LMs' and the LocDiT's qkv, o, gate/up and down; o and down split K.
FEW_ROWS_SHAPES = [(2048, 2560), (2048, 2048), (2048, 12288), (6144, 2048), (1024, 2560), (2048, 1024), (4096, 1024)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("k", "n"), FEW_ROWS_SHAPES)
@pytest.mark.parametrize("lead", [(1,), (2, 11), (32,)])
def test_few_rows_linear(dtype: torch.dtype, k: int, n: int, lead: tuple[int, ...]) -> None:
    """Against an fp32 product of the same operands: one rounding of the output (bf16 ~2e-3 relative)."""
    x = torch.randn(*lead, k, device="cuda", dtype=dtype)
    weight = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
    assert triton_ops.few_rows_fit(x, weight, gated=False)
    got = kernels.linear(x, weight)
    want = torch.nn.functional.linear(x.float(), weight.float())
    assert got.shape == (*lead, n) and got.dtype == dtype
    assert _rel(got, want) < (3e-3 if dtype == torch.bfloat16 else 5e-4)


def test_few_rows_split_k_is_deterministic_in_graphs() -> None:
    """The split-K launches (narrow N, long K) sum their partials in a fixed order, and each launch's last program
    resets the arrival counts: many launches in one CUDA graph, replayed, give the eager result bit for bit (a
    count left over, or a partial read before it was written, would not)."""
    x = torch.randn(22, 4096, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) / 64
    eager = kernels.linear(x, weight)
    graph, outs = torch.cuda.CUDAGraph(), []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernels.linear(x, weight)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        outs = [kernels.linear(x, weight) for _ in range(50)]
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(out, eager) for out in outs)
    counts = [count for (_, n, _), (_, count) in triton_ops._split_scratch.items() if n == 1024]
    assert counts and all(not count.any() for count in counts)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("k", "n"), [(2048, 6144), (1024, 4096)])
@pytest.mark.parametrize("rows", [1, 22])
def test_few_rows_gate_up_silu(dtype: torch.dtype, k: int, n: int, rows: int) -> None:
    """One kernel against the twin (cuBLAS's product, then silu_mul): the two GEMMs sum in different orders, so a
    gate or up value can round to the other side of one 16-bit step; the roundings after it are the twin's."""
    x = torch.randn(rows, k, device="cuda", dtype=dtype)
    weight = torch.randn(2 * n, k, device="cuda", dtype=dtype) / k**0.5
    got = kernels.gate_up_silu(x, weight)
    want = kernels.silu_mul_torch(torch.nn.functional.linear(x, weight))
    assert got.shape == (rows, n)
    assert _rel(got, want) < (8e-3 if dtype == torch.bfloat16 else 1e-3)


def test_few_rows_refuses_what_it_does_not_cover() -> None:
    weight = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    assert not triton_ops.few_rows_fit(torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16), weight, False)
    assert not triton_ops.few_rows_fit(torch.randn(4, 1024, device="cuda"), weight, False)  # fp32 x
    assert not triton_ops.few_rows_fit(torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)[:, ::2], weight, False)
    assert not triton_ops.few_rows_fit(
        torch.randn(4, 96, device="cuda", dtype=torch.bfloat16), weight[:, :96].contiguous(), False
    )
    x, bias = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16), torch.randn(2048, device="cuda")
    assert torch.equal(
        kernels.linear(x, weight, bias.bfloat16()), torch.nn.functional.linear(x, weight, bias.bfloat16())
    )


@pytest.mark.parametrize("lead", [(7,), (6, 11), (2048,)])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(16, 2, 128), (16, 2, 64), (4, 2, 8)])
def test_rope_in_place_on_qkv_views(lead: tuple[int, ...], heads: int, kv_heads: int, dim: int) -> None:
    """q and k are strided views of one qkv GEMM output, as in Attention.forward. (An element's rotation reads its
    partner half, which is also rotated in place: a kernel that lets one thread store before another loaded fails
    here now and then; 2048 tokens make that likely.)"""
    rows = lead[-1]
    qkv = torch.randn(*lead, (heads + 2 * kv_heads) * dim, device="cuda", dtype=torch.bfloat16)
    q, k, _ = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q, k = q.view(*lead, heads, dim), k.view(*lead, kv_heads, dim)
    table = torch.randn(rows, 1, dim, device="cuda", dtype=torch.bfloat16)
    cos, sin = table.cos(), table.sin()
    expected = kernels.rope_torch(q, cos, sin), kernels.rope_torch(k, cos, sin)
    v_before = qkv[..., (heads + kv_heads) * dim :].clone()
    q_out, k_out = triton_ops.rope_qk_(q, k, cos, sin)
    assert q_out.data_ptr() == q.data_ptr()  # rotated in place
    for got, want in zip((q_out, k_out), expected, strict=True):
        assert _rel(got, want) < 4e-3
        assert float((got.float() - want.float()).abs().max()) <= 2**-6 * float(want.float().abs().max())
    assert torch.equal(qkv[..., (heads + kv_heads) * dim :], v_before)  # v untouched


@pytest.mark.parametrize("shape", [(1, 2 * 4096), (513, 2 * 4096), (3, 11, 2 * 6144), (2, 16)])
def test_silu_mul(shape: tuple[int, ...]) -> None:
    gate_up = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 4
    got = triton_ops.silu_mul(gate_up)
    want = kernels.silu_mul_torch(gate_up)
    assert got.shape == want.shape and _rel(got, want) < 4e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 2048, 4), (16, 64, 7680 + 6), (3, 5, 17)])
def test_snake(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    x = torch.randn(shape, device="cuda", dtype=dtype) * 2
    alpha = torch.rand(1, shape[1], 1, device="cuda", dtype=dtype) + 0.3
    exact = kernels.snake_torch(x.double(), alpha.double())
    got, twin = triton_ops.snake(x, alpha), kernels.snake_torch(x, alpha)
    # One rounding instead of the twin's five: at least as close to the float64 result as the twin.
    assert _rel(got, exact) <= max(_rel(twin, exact), 1e-6) * 1.01
    assert _rel(got, twin) < 2e-3


@triton.jit
def _sine_probe(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, triton_ops._sin(tl.load(x_ptr + i, mask=i < n, other=0.0)), mask=i < n)


@pytest.mark.parametrize("span", [4.0, 300.0, 3e4])
def test_kernel_sine_against_float64(span: float) -> None:
    """The Snake kernels' sine (the SFU's after an fma reduction to [-π, π]) of fp32 arguments up to `span` radians:
    within 2e-6 of float64's sine of the same fp32 value however large (the VAE's Snake sees hundreds of radians;
    its fp16 outputs have ulps of 1e-3 and more)."""
    x = (torch.rand(1 << 20, device="cuda") * 2 - 1) * span
    got = torch.empty_like(x)
    _sine_probe[(x.numel() // 1024,)](x, got, x.numel(), BLOCK=1024)
    assert float((got.double() - torch.sin(x.double())).abs().max()) < 2e-6


def test_snake_reads_strided_rows() -> None:
    """A conv-transpose output cut in time (rows not contiguous) goes through the kernel, not the twin."""
    full = torch.randn(3, 40, 300, device="cuda", dtype=torch.float16)
    x = full[..., 4:-6]
    alpha = torch.rand(1, 40, 1, device="cuda", dtype=torch.float16) + 0.3
    got = triton_ops.snake(x, alpha)
    assert got.is_contiguous() and _rel(got, kernels.snake_torch(x, alpha)) < 2e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("channels", "length"), [(2048, 4), (64, 3840), (5, 17)])
def test_snake_with_channel_affine(dtype: torch.dtype, channels: int, length: int) -> None:
    """The VAE's sample-rate conditioning (x * scale + shift) applied by the Snake as it loads strided rows."""
    x = torch.randn(3, channels, length + 10, device="cuda", dtype=dtype)[..., 4:-6] * 2
    alpha = torch.rand(1, channels, 1, device="cuda", dtype=dtype) + 0.3
    scale = torch.rand(1, channels, 1, device="cuda", dtype=dtype) + 0.5
    shift = torch.randn(1, channels, 1, device="cuda", dtype=dtype)
    got = triton_ops.snake(x, alpha, (scale, shift))
    twin = kernels.snake_torch(x, alpha, (scale, shift))
    assert got.is_contiguous() and _rel(got, twin) < 2e-3
    # The kernel keeps x * scale + shift in fp32 where the twin rounds it twice: at least as close to fp32 math.
    exact = kernels.snake_torch(x.double(), alpha.double(), (scale.double(), shift.double()))
    assert _rel(got.double(), exact) <= _rel(twin.double(), exact) + 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("batch", "cin", "cout", "length"), [(2, 1024, 1024, 32), (5, 32, 32, 7680), (1, 8, 4, 3)])
def test_pointwise_residual(dtype: torch.dtype, bias: bool, batch: int, cin: int, cout: int, length: int) -> None:
    """The residual is a strided view (a transposed conv's output cut in time, as the first residual unit of a
    VAE block gets). PyTorch's cuDNN conv adds its bias in a pass of its own, rounding as the kernel does: the
    twin's bits exactly."""
    h = torch.randn(batch, cin, length, device="cuda", dtype=dtype)
    weight = torch.randn(cout, cin, 1, device="cuda", dtype=dtype) / cin**0.5
    b = torch.randn(cout, device="cuda", dtype=dtype) if bias else None
    residual = torch.randn(batch, cout, length + 9, device="cuda", dtype=dtype)[..., 3:-6]
    got = triton_ops.pointwise_residual(h, weight, b, residual)
    assert got.shape == (batch, cout, length) and got.is_contiguous()
    assert torch.equal(got, kernels.pointwise_residual_torch(h, weight, b, residual))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("keep", "affine"), [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize(("batch", "channels", "length"), [(2, 1024, 32), (5, 32, 7680), (1, 8, 3)])
def test_pointwise_residual_snake(dtype: torch.dtype, keep: bool, affine: bool, batch: int, channels: int, length: int):
    """A residual unit's end with the next layer's Snake in the same pass: the output the twin's bits exactly (when
    kept), the Snake the Snake kernel's of that output (fp32 math), as close to the twin's as that kernel is."""
    h = torch.randn(batch, channels, length, device="cuda", dtype=dtype)
    weight = torch.randn(channels, channels, 1, device="cuda", dtype=dtype) / channels**0.5
    b = torch.randn(channels, device="cuda", dtype=dtype)
    residual = torch.randn(batch, channels, length + 9, device="cuda", dtype=dtype)[..., 3:-6] * 2
    alpha = torch.rand(1, channels, 1, device="cuda", dtype=dtype) + 0.3
    channel_affine = None
    if affine:
        scale = torch.rand(1, channels, 1, device="cuda", dtype=dtype) + 0.5
        channel_affine = (scale, torch.randn(1, channels, 1, device="cuda", dtype=dtype))
    y, act = triton_ops.pointwise_residual_snake(h, weight, b, residual, alpha, channel_affine, keep)
    twin_y, twin_act = kernels.pointwise_residual_snake_torch(h, weight, b, residual, alpha, channel_affine, keep)
    assert (y is None) == (twin_y is None) == (not keep)
    if keep:
        assert torch.equal(y, twin_y)
    assert act.is_contiguous() and act.shape == (batch, channels, length)
    # The Snake kernel's own result for the same rounded output (one pass or two: the same arithmetic).
    plain = kernels.pointwise_residual_torch(h, weight, b, residual)
    assert _rel(act, triton_ops.snake(plain, alpha, channel_affine)) < 1e-4
    assert _rel(act, twin_act) < 2e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("cin", "cout", "stride", "length"), [(256, 128, 2, 960), (512, 256, 5, 192), (6, 3, 7, 2)])
def test_causal_conv_transpose_snake(dtype: torch.dtype, bias: bool, cin: int, cout: int, stride: int, length: int):
    """The streaming upsampling conv with its first residual unit's Snake from the bias pass: the output exactly the
    kernel's without it, the Snake the Snake kernel's of that output."""
    x = torch.randn(3, cin, length, device="cuda", dtype=dtype)
    context = torch.randn(3, cin + 10, device="cuda", dtype=dtype)[:, 10:].view(3, cin, 1)
    weight = torch.randn(cin, cout, 2 * stride, device="cuda", dtype=dtype) / (2 * cin) ** 0.5
    b = torch.randn(cout, device="cuda", dtype=dtype) if bias else None
    alpha = torch.rand(1, cout, 1, device="cuda", dtype=dtype) + 0.3
    y, act = triton_ops.causal_conv_transpose_snake(x, context, weight, b, stride, alpha)
    plain = triton_ops.causal_conv_transpose(x, context, weight, b, stride)
    assert torch.equal(y, plain) and _rel(act, triton_ops.snake(plain, alpha)) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("cin", "cout", "stride", "length"), [(2048, 1024, 8, 5), (64, 32, 2, 3841), (6, 3, 7, 2)])
def test_conv_transpose_crop(dtype: torch.dtype, bias: bool, cin: int, cout: int, stride: int, length: int) -> None:
    """The VAE's upsampling conv cropped as when streaming (one context frame's samples on the left, the trim on
    the right). cuDNN's transposed conv adds its bias in a pass of its own too: the twin's bits exactly."""
    x = torch.randn(3, cin, length, device="cuda", dtype=dtype)
    weight = torch.randn(cin, cout, 2 * stride, device="cuda", dtype=dtype) / cin**0.5
    b = torch.randn(cout, device="cuda", dtype=dtype) if bias else None
    got = triton_ops.conv_transpose_crop(x, weight, b, stride, stride, stride)
    assert torch.equal(got, kernels.conv_transpose_crop_torch(x, weight, b, stride, stride, stride))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("cin", "cout", "stride", "length"),
    [(256, 128, 2, 960), (64, 32, 2, 3840), (512, 256, 5, 192), (192, 96, 2, 17), (6, 3, 7, 2), (1024, 512, 6, 3)],
)
def test_causal_conv_transpose(dtype: torch.dtype, bias: bool, cin: int, cout: int, stride: int, length: int) -> None:
    """The streaming upsampling conv without the context's concatenation (the context frame's part of the first
    samples added after the conv): against the twin and float64. The context is a strided view of a flat per-slot
    state, as in streaming."""
    x = torch.randn(3, cin, length, device="cuda", dtype=dtype)
    context = torch.randn(3, cin + 10, device="cuda", dtype=dtype)[:, 10:].view(3, cin, 1)
    weight = torch.randn(cin, cout, 2 * stride, device="cuda", dtype=dtype) / (2 * cin) ** 0.5
    b = torch.randn(cout, device="cuda", dtype=dtype) if bias else None
    with torch.backends.cudnn.flags(allow_tf32=False):  # fp32 cuDNN convs would run in TF32
        got = triton_ops.causal_conv_transpose(x, context, weight, b, stride)
        twin = kernels.causal_conv_transpose_torch(x, context, weight, b, stride)
        exact = kernels.causal_conv_transpose_torch(
            x.double(), context.double(), weight.double(), b.double() if b is not None else None, stride
        )
    assert got.shape == twin.shape == (3, cout, length * stride)
    assert _rel(got, twin) < (2e-3 if dtype == torch.float16 else 1e-5)
    assert _rel(got, exact) <= max(_rel(twin, exact), 1e-6) * 1.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("batch", "patch", "feat"), [(1, 4, 64), (512, 4, 64), (37, 2, 64), (3, 3, 5)])
def test_guided_euler(dtype: torch.dtype, batch: int, patch: int, feat: int) -> None:
    """The CFG-Zero* guidance and Euler update of a solver iteration; the velocities are the two halves of one
    estimator output, as in CFM.step. The kernel rounds where the twin's ops round; only the order of the two
    per-row sums may differ (a last-bit difference of the guidance scale now and then)."""
    x0 = torch.randn(batch, patch, feat, device="cuda", dtype=dtype)
    v_c, v_u = torch.randn(2 * batch, patch, feat, device="cuda", dtype=dtype).split(batch)
    v_c = v_c + 0.5 * v_u  # correlated, as guided velocities are
    cfg = torch.rand(batch, device="cuda") * 3
    dt = (torch.rand(batch, device="cuda") * 0.2).to(dtype)
    dt[0] = 0  # a row whose steps are done
    frozen = torch.rand(batch, device="cuda") < 0.3  # rows in their zero-velocity steps
    got, twin = x0.clone(), x0.clone()
    triton_ops.guided_euler_(got, v_c, v_u, cfg, dt, frozen)
    kernels.guided_euler_torch_(twin, v_c, v_u, cfg, dt, frozen)
    still = frozen | (dt == 0)
    assert torch.equal(got[still], x0[still]) and torch.equal(twin[still], x0[still])
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dtype]
    if (~still).any():
        assert _rel(got - x0, twin - x0) < tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("dilation", [1, 3, 9])
@pytest.mark.parametrize(("batch", "channels", "length"), [(2, 1024, 32), (5, 32, 7680), (1, 8, 3)])
def test_causal_conv_snake(dtype: torch.dtype, dilation: int, batch: int, channels: int, length: int) -> None:
    """Depthwise k7 conv over [context | x] then Snake, against the twin and float64; the context is a strided view
    of a flat per-slot state as in streaming, and shorter or longer than x."""
    ctx = 6 * dilation
    x = torch.randn(batch, channels, length, device="cuda", dtype=dtype)
    state = torch.randn(batch, channels * ctx + 10, device="cuda", dtype=dtype)
    context = state[:, 10:].view(batch, channels, ctx)
    weight = torch.randn(channels, 1, 7, device="cuda", dtype=dtype) / 3
    bias = torch.randn(channels, device="cuda", dtype=dtype)
    alpha = torch.rand(1, channels, 1, device="cuda", dtype=dtype) + 0.3
    args = (context, weight, bias, dilation, alpha)
    got = triton_ops.causal_conv_snake(x, *args)
    twin = kernels.causal_conv_snake_torch(x, *args)
    exact = kernels.causal_conv_snake_torch(x.double(), *(a.double() if torch.is_tensor(a) else a for a in args))
    assert got.shape == twin.shape == (batch, channels, length)
    assert _rel(got, twin) < (3e-3 if dtype == torch.float16 else 1e-5)
    assert _rel(got, exact) <= max(_rel(twin, exact), 1e-6) * 1.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("batch", "channels", "cout", "length"), [(3, 32, 1, 7680), (2, 5, 3, 17), (1, 8, 4, 3)])
def test_causal_conv(dtype: torch.dtype, bias: bool, batch: int, channels: int, cout: int, length: int) -> None:
    """The VAE's output conv (k7, a few output channels) over [context | x]: the context a strided view of a flat
    per-slot state as in streaming, longer than x for the short case; against the twin and float64."""
    x = torch.randn(batch, channels, length, device="cuda", dtype=dtype)
    state = torch.randn(batch, channels * 6 + 10, device="cuda", dtype=dtype)
    context = state[:, 10:].view(batch, channels, 6)
    weight = torch.randn(cout, channels, 7, device="cuda", dtype=dtype) / (7 * channels) ** 0.5
    b = torch.randn(cout, device="cuda", dtype=dtype) if bias else None
    got = triton_ops.causal_conv(x, context, weight, b, 1)
    twin = kernels.causal_conv_torch(x, context, weight, b, 1)
    exact = kernels.causal_conv_torch(
        x.double(), context.double(), weight.double(), b.double() if b is not None else None, 1
    )
    assert got.shape == twin.shape == (batch, cout, length) and got.is_contiguous()
    assert _rel(got, twin) < (2e-3 if dtype == torch.float16 else 1e-5)
    assert _rel(got, exact) <= max(_rel(twin, exact), 1e-6) * 1.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq", [1, 5, 11, 32])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(16, 2, 128), (16, 2, 64), (4, 4, 16)])
def test_dense_attention(dtype: torch.dtype, seq: int, heads: int, kv_heads: int, dim: int) -> None:
    """q/k/v are views of one qkv GEMM output, as in Attention.forward; against SDPA and a float64 reference."""
    rows = 37
    qkv = torch.randn(rows, seq, (heads + 2 * kv_heads) * dim, device="cuda", dtype=dtype)
    q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q, k, v = q.view(rows, seq, heads, dim), k.view(rows, seq, kv_heads, dim), v.view(rows, seq, kv_heads, dim)
    scale = dim**-0.5
    got = triton_ops.dense_attention(q, k, v, scale)
    twin = kernels.dense_attention_torch(q, k, v, scale)
    exact = kernels.dense_attention_torch(q.double(), k.double(), v.double(), scale)
    assert got.shape == q.shape and got.is_contiguous()
    assert _rel(got, twin) < 1e-2
    assert _rel(got, exact) <= max(_rel(twin, exact), 1e-4) * 1.5


# Slot per row for `rows` rows of `slots` slots (slot 0: no adapter), as LoRA steps mix them.
LORA_MIXES = {
    "none": lambda rows, slots: torch.zeros(rows),
    "one slot": lambda rows, slots: torch.full((rows,), slots - 1),
    "every slot": lambda rows, slots: torch.arange(rows) % (slots - 1) + 1,
    "round robin with none": lambda rows, slots: torch.arange(rows) % slots,
    "random": lambda rows, slots: torch.randint(0, slots, (rows,)),
}


def _lora_weights(slots: int, rank: int, k: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(slots, rank, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(slots, rank, n, device="cuda", dtype=dtype) * 0.05
    a[0], b[0] = 0, 0
    return a, b


def _assert_lora_close(got: torch.Tensor, expected: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> None:
    update = (expected.float() - y.float()).norm()
    tol = 4e-3 if got.dtype == torch.bfloat16 else 1e-5
    assert float((got.float() - expected.float()).norm()) <= tol * max(float(update), 1.0)
    none = index == 0
    assert torch.equal(got[none], y[none])  # rows without an adapter are untouched


def _assert_grouped(rows: kernels.LoRARows, index: torch.Tensor, slots: int) -> None:
    """rows.order lists the rows of slots 1.. slot by slot in their order (a stable sort), and segments bound them."""
    assert rows.order is not None and rows.segments is not None
    placed = int(rows.segments[-1])
    assert placed == int((index > 0).sum()) and int(rows.segments[1]) == 0
    by_slot = torch.sort(torch.where(index > 0, index, slots).long(), stable=True).indices
    assert torch.equal(rows.order[:placed].long(), by_slot[:placed])
    counts = torch.bincount(index.long(), minlength=slots)
    assert torch.equal(rows.segments[1:].diff().long(), counts[1:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("rows", "k", "n", "rank"),
    [(1, 64, 64, 16), (37, 128, 96, 24), (256, 2048, 2560, 96), (300, 2048, 2048, 32), (5632, 1024, 1024, 32)],
)
@pytest.mark.parametrize("mix", LORA_MIXES)
def test_lora_add_equals_its_twin(dtype: torch.dtype, rows: int, k: int, n: int, rank: int, mix: str) -> None:
    """Rows of 8 adapters and rows of none in one call, grouped by slot, against the twin: row counts that are not
    a multiple of any tile, a fused q/k/v's 3 rank blocks (96), the LM's and a LocDiT call's row counts at B=256."""
    slots = 9
    a, b = _lora_weights(slots, rank, k, n, dtype)
    x = torch.randn(rows, k, device="cuda", dtype=dtype)
    y = torch.randn(rows, n, device="cuda", dtype=dtype)
    index = LORA_MIXES[mix](rows, slots).to(device="cuda", dtype=torch.int32)
    grouped = triton_ops.lora_rows(index, slots)
    _assert_grouped(grouped, index, slots)
    expected = y.clone()
    kernels.lora_add_torch(expected, x, index, a, b)
    got = y.clone()
    triton_ops.lora_add_(got, x, grouped, a, b)
    _assert_lora_close(got, expected, y, index)


@pytest.mark.parametrize("blocks", [(16, 16), (32, 64), (64, 32), (64, 64)])
@pytest.mark.parametrize("slots", [2, 9, 33])
def test_lora_add_every_tile_size(blocks: tuple[int, int], slots: int) -> None:
    """Each BLOCK_M of the shrink and the expand, with pools of one, 8 and 32 adapters (several grouping blocks)."""
    rows, k, n, rank = 2500, 256, 320, 24
    a, b = _lora_weights(slots, rank, k, n, torch.bfloat16)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    index = torch.randint(0, slots, (rows,), device="cuda", dtype=torch.int32)
    grouped = triton_ops.lora_rows(index, slots)
    _assert_grouped(grouped, index, slots)
    expected = y.clone()
    kernels.lora_add_torch(expected, x, index, a, b)
    got = y.clone()
    triton_ops.lora_add_(got, x, grouped, a, b, blocks)
    _assert_lora_close(got, expected, y, index)


@torch.inference_mode()
def test_lora_linear_on_the_locdit_layout() -> None:
    """A LocDiT q/k/v linear at B=256: x [2B, S, in] with one slot per CFG row [2B] (both halves of a sequence use
    its adapter), through LoRALinear and the index its AdapterRows prepares once for both linears that read it."""
    from engine.lora.linear import AdapterRows, LoRALinear, Part, Site

    batch, seq, hidden, slots, rank = 256, 11, 1024, 9, 32
    rows = AdapterRows(slots)
    linears = []
    for name, n in (("qkv_proj", 2560), ("o_proj", hidden)):
        base = torch.nn.Linear(hidden, n, bias=False, device="cuda", dtype=torch.bfloat16)
        site = Site(name, (Part(name, 0, n),), hidden, "dit", "dit")
        layer = LoRALinear(base, site, rank, rows)
        a, b = _lora_weights(slots, rank, hidden, n, torch.bfloat16)
        layer.lora_a.copy_(a)
        layer.lora_b.copy_(b)
        linears.append(layer)
    per_sequence = (torch.arange(batch, device="cuda") % slots).int()
    rows.dit = torch.cat((per_sequence, per_sequence))
    x = torch.randn(2 * batch, seq, hidden, device="cuda", dtype=torch.bfloat16)
    got = [layer(x) for layer in linears]
    assert len(rows._prepared) == 1  # one grouping for both linears
    index = rows.dit[:, None].expand(2 * batch, seq).reshape(-1)
    for layer, out in zip(linears, got, strict=True):
        y = torch.nn.functional.linear(x, layer.weight).view(-1, layer.out_features)
        expected = y.clone()
        kernels.lora_add_torch(expected, x.view(-1, hidden), index, layer.lora_a, layer.lora_b)
        assert out.shape == (2 * batch, seq, layer.out_features)
        _assert_lora_close(out.view(-1, layer.out_features), expected, y, index)


def test_lora_add_replays_in_a_cuda_graph() -> None:
    """Grouping and kernels captured once, replayed with other slots per row: the graph follows the staged index."""
    slots, rows = 5, 300
    a, b = _lora_weights(slots, 16, 128, 256, torch.bfloat16)
    x = torch.randn(rows, 128, device="cuda", dtype=torch.bfloat16)
    y0 = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    index = torch.zeros(rows, dtype=torch.int32, device="cuda")
    y = y0.clone()
    triton_ops.lora_add_(y, x, triton_ops.lora_rows(index, slots), a, b)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_ops.lora_add_(y, x, triton_ops.lora_rows(index, slots), a, b)
    for mix in ("random", "one slot", "none", "every slot"):
        index.copy_(LORA_MIXES[mix](rows, slots))
        y.copy_(y0)
        graph.replay()
        expected = y0.clone()
        kernels.lora_add_torch(expected, x, index, a, b)
        _assert_lora_close(y, expected, y0, index)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("batch", "channels", "length"), [(1, 96, 1920), (64, 768, 32), (3, 5, 7)])
def test_snake_beta(dtype: torch.dtype, batch: int, channels: int, length: int) -> None:
    """Against the twin, on a time-sliced input (a trimmed transposed-conv output is strided so)."""
    full = torch.randn(batch, channels, length + 9, device="cuda", dtype=dtype) * 8
    x = full[..., 4 : 4 + length]
    log_alpha = torch.randn(channels, device="cuda") * 0.3
    log_beta = torch.randn(channels, device="cuda") * 0.3
    got = triton_ops.snake_beta(x, log_alpha, log_beta)
    want = kernels.snake_beta_torch(x, log_alpha, log_beta)
    assert got.dtype == dtype and got.is_contiguous()
    # Both compute in fp32 and round once: one ulp of the storage dtype apart at most, plus what an ulp of exp(a)
    # or of sin moves sin²(a·x) by at |a·x| up to ~80 rad (~1e-5; 1e-4 allowed).
    ulp = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 2**-23}[dtype]
    assert bool(((got.float() - want.float()).abs() <= ulp * want.float().abs() + 1e-4).all())


@pytest.mark.parametrize("lead", [(7,), (64, 1), (6, 2), (2048,)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qk_norm_rope_in_place_on_qkv_views(lead: tuple[int, ...], dtype: torch.dtype) -> None:
    """As Attention._qkv calls it with fused projections: q and k strided views of one qkv output, fp32 tables
    with one row per position (the last lead axis), v untouched."""
    heads, kv_heads, dim = 16, 8, 128
    rows = lead[-1]
    qkv = torch.randn(*lead, (heads + 2 * kv_heads) * dim, device="cuda", dtype=dtype) * 3
    q, k, _ = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q, k = q.view(*lead, heads, dim), k.view(*lead, kv_heads, dim)
    qw = (torch.rand(dim, device="cuda") + 0.5).to(dtype)
    kw = (torch.rand(dim, device="cuda") + 0.5).to(dtype)
    angles = torch.randn(rows, 1, dim, device="cuda") * 10
    cos, sin = angles.cos(), angles.sin()
    want = kernels.qk_norm_rope_torch(q, k, qw, kw, 1e-6, cos, sin)
    v_before = qkv[..., (heads + kv_heads) * dim :].clone()
    got = triton_ops.qk_norm_rope_(q, k, qw, kw, 1e-6, cos, sin)
    assert got[0].data_ptr() == q.data_ptr()  # in place
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) < 4e-3
        assert float((g.float() - w.float()).abs().max()) <= 2**-6 * float(w.float().abs().max())
    assert torch.equal(qkv[..., (heads + kv_heads) * dim :], v_before)


@pytest.mark.parametrize("count", [2048, 3072, 5])
def test_counter_uniform_gives_the_twins_bits(count: int) -> None:
    from engine.noise import uniform_torch

    seeds = torch.tensor([0, 1, 2**63 - 1, 123456789012345, 2**32 + 5], dtype=torch.int64, device="cuda")
    steps = torch.tensor([0, 7, 2**32 - 1, 15, 3], dtype=torch.int64, device="cuda")
    assert torch.equal(triton_ops.counter_uniform(seeds, steps, count), uniform_torch(seeds, steps, count))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("start", "len_q"), [(0, 2), (2, 1), (9, 1), (15, 1)])
def test_cached_attention_writes_the_cache_and_attends_causally(dtype: torch.dtype, start: int, len_q: int) -> None:
    """As the code predictor calls it: q/k/v views of one qkv output, fp32 caches [B, 16, Hkv, D] holding earlier
    positions (and junk past them, which must not be read)."""
    batch, heads, kv_heads, dim, max_len = 64, 16, 8, 128, 16
    qkv = torch.randn(batch, len_q, (heads + 2 * kv_heads) * dim, device="cuda", dtype=dtype)
    q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q, k, v = q.view(batch, len_q, heads, dim), k.view(batch, len_q, kv_heads, dim), v.view(batch, len_q, kv_heads, dim)
    caches = [torch.randn(batch, max_len, kv_heads, dim, device="cuda") for _ in range(2)]
    mine = [c.clone() for c in caches]
    want = kernels.cached_attention_torch(q, k, v, *caches, start, dim**-0.5)
    got = triton_ops.cached_attention(q, k, v, *mine, start, dim**-0.5)
    assert got.dtype == dtype and got.shape == want.shape
    assert _rel(got, want) < (4e-3 if dtype == torch.bfloat16 else 1e-5)
    for c, m in zip(caches, mine, strict=True):
        assert torch.equal(c[:, : start + len_q], m[:, : start + len_q])


def _assert_fp8_rows(q: torch.Tensor, scale: torch.Tensor, twin: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The kernel's e4m3 rows and scales against the twin's: scales to fp32 rounding, and each value the twin's or,
    where the division rounded differently right at an e4m3 midpoint, one e4m3 step from it (at most 0.1 %)."""
    q_twin, scale_twin = twin
    assert q.dtype == torch.float8_e4m3fn and q.shape == q_twin.shape and scale.shape == scale_twin.shape
    torch.testing.assert_close(scale, scale_twin, rtol=1e-6, atol=0)
    got, want = q.float(), q_twin.float()
    differ = got != want
    assert float(differ.float().mean()) <= 1e-3
    assert bool(((got - want).abs() <= want.abs() / 8 + 2**-9)[differ].all())  # e4m3: 3 mantissa bits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1024), (11264, 2048), (37, 4096), (5, 24)])
def test_quantize_rows(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    x = torch.randn(shape, device="cuda", dtype=dtype) * 5
    x[0] = 0  # an all-zero row: the smallest scale, zeros
    _assert_fp8_rows(*triton_ops.quantize_rows(x), kernels.quantize_rows_torch(x))


@pytest.mark.parametrize("shape", [(1, 1024), (6, 11, 1024), (11264, 1024), (9, 48)])
def test_rms_norm_fp8_and_add_rms_norm_fp8(shape: tuple[int, ...]) -> None:
    """The norms that feed FP8 GEMMs write the e4m3 rows and scales that quantising their bf16 output gives (whose
    closeness to the twin test_rms_norm_and_add_rms_norm checks), and the same bf16 sum."""
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3
    update = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(shape[-1], device="cuda", dtype=torch.bfloat16) + 0.5
    x[(0,) * (x.dim() - 1)] = 0  # an all-zero row: the smallest scale, zeros
    update[(0,) * (x.dim() - 1)] = 0
    summed, normed = triton_ops.add_rms_norm(x, update, weight, 1e-5)
    fused_sum, *fused = triton_ops.add_rms_norm_fp8(x, update, weight, 1e-5)
    assert torch.equal(fused_sum, summed)
    for (q, scale), bf16 in (
        (triton_ops.rms_norm_fp8(x, weight, 1e-5), triton_ops.rms_norm(x, weight, 1e-5)),
        (fused, normed),
    ):
        assert q.shape == shape and scale.shape == (*shape[:-1], 1)
        _assert_fp8_rows(q.flatten(0, -2), scale.flatten(0, -2), kernels.quantize_rows_torch(bf16.flatten(0, -2)))


@pytest.mark.parametrize("shape", [(1, 8192), (6, 11, 8192), (9, 48)])
def test_silu_mul_fp8(shape: tuple[int, ...]) -> None:
    gate_up = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3
    q, scale = triton_ops.silu_mul_fp8(gate_up)
    assert q.shape == (*shape[:-1], shape[-1] // 2) and scale.shape == (*shape[:-1], 1)
    q_twin, scale_twin = kernels.silu_mul_fp8_torch(gate_up)
    _assert_fp8_rows(q.flatten(0, -2), scale.flatten(0, -2), (q_twin.flatten(0, -2), scale_twin.flatten(0, -2)))


@pytest.mark.parametrize(("m", "k", "n"), [(1, 1024, 2560), (11264, 1024, 8192), (300, 4096, 1024)])
def test_fp8_matmul_is_the_dequantised_product(m: int, k: int, n: int) -> None:
    """cuBLAS's rowwise-scaled FP8 GEMM against the fp32 product of the dequantised operands, rounded to bf16."""
    x, weight = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda") / k**0.5
    q, scale = kernels.quantize_rows_torch(x)
    w, w_scale = kernels.quantize_rows_torch(weight)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    got = kernels.fp8_matmul(q, scale, w, w_scale.t().contiguous(), bias, torch.bfloat16)
    want = kernels.scaled_mm_torch(q, scale, w, w_scale.t(), torch.float32) + bias.float()
    assert _rel(got, want) < 4e-3


def _dequantise_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.repeat_interleave(kernels.FP8_BLOCK, dim=-1)


def _gate_up_operands(m: int, k: int, n: int) -> tuple[torch.Tensor, ...]:
    x, weight = torch.randn(m, k, device="cuda") * 2, torch.randn(2 * n, k, device="cuda") / k**0.5
    return (*kernels.quantize_rows_torch(x), *kernels.quantize_rows_torch(weight))


@pytest.mark.parametrize("launch", [triton_ops.GATE_UP_LAUNCH, (64, 64, 4, 3)])  # the engine's, a sweep's
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
# The LocDiT's shapes (a B=512 step, a small one), the LMs' (an admission of a few prompts), the smallest.
@pytest.mark.parametrize(("m", "k", "n"), [(11264, 1024, 4096), (530, 1024, 4096), (530, 2048, 6144), (1, 256, 128)])
def test_gate_up_silu_fp8(dtype: torch.dtype, m: int, k: int, n: int, launch: tuple[int, int, int, int]) -> None:
    """The gate/up GEMM with SiLU*mul and 1x128 quantising in its epilogue against its twin (an fp32 product of the
    same e4m3 operands). The kernel's FP8 tensor-core sums differ from the twin's (order, and the accumulation's
    own precision), so a gate or up value can round to the other side of a 16-bit step, a block's amax with it, and
    an e4m3 value to the next step. Measured on an H200 (bf16; fp16 is closer): 0.9 % of the scales more than 1 %
    off, none more than 2.8 %; 3.3 % of the e4m3 values one step off; the rows 1.0 % off overall. The bounds leave
    some room over that, where there are many values: at 1x128 a few large values one step off made the row 4 % off,
    so there each value is bounded instead: within an e4m3 step (1/8) and its block's scale difference (under 5 %) of
    the twin's, or below e4m3's normal range (2^-6 of the block's scale). Rows past M, up to a multiple of
    BLOCK_MLP_ROWS, are zeros."""
    q, scale, w, w_scale = _gate_up_operands(m, k, n)
    h, h_scale = triton_ops.gate_up_silu_fp8(q, scale, w, w_scale.t().contiguous(), dtype, launch)
    h_twin, h_scale_twin = kernels.gate_up_silu_fp8_torch(q, scale, w, w_scale.t(), dtype)
    rows = -(-m // kernels.BLOCK_MLP_ROWS) * kernels.BLOCK_MLP_ROWS
    assert h.dtype == kernels.FP8 and h.shape == (rows, n) and h_scale.shape == (rows, n // kernels.FP8_BLOCK)
    assert h_scale.stride() == (1, rows)  # column-major, as cuBLAS's block-scaled GEMM takes it
    assert not h[m:].float().any() and bool((h_scale[m:] == kernels.FP8_MIN_AMAX / kernels.FP8_MAX).all())
    scale_rel = (h_scale[:m] - h_scale_twin).abs() / h_scale_twin
    got, want = _dequantise_blocks(h[:m], h_scale[:m]), _dequantise_blocks(h_twin, h_scale_twin)
    stats = {
        "scales_over_1pc": float((scale_rel > 1e-2).float().mean()),
        "scale_rel_max": float(scale_rel.max()),
        "e4m3_differ": float((h[:m].float() != h_twin.float()).float().mean()),
        "rel": _rel(got, want),
    }
    print(f"gate_up_silu_fp8 {m}x{k}x{n} {dtype} {launch}: {stats}")
    assert stats["scale_rel_max"] < 0.05
    if m * n >= 2**16:
        assert stats["scales_over_1pc"] <= 0.02 and stats["e4m3_differ"] < 0.06 and stats["rel"] < 0.015
    else:
        normal = 2**-6 * h_scale_twin.repeat_interleave(kernels.FP8_BLOCK, dim=-1)
        assert bool(((got - want).abs() <= want.abs() * (1 / 8 + 0.05) + normal).all())


@pytest.mark.parametrize(
    ("m", "k", "n", "hidden"), [(11264, 1024, 4096, 1024), (530, 1024, 4096, 1024), (7, 256, 512, 128)]
)
def test_fp8_block_mlp_is_its_twins(m: int, k: int, n: int, hidden: int) -> None:
    """The fused gate/up kernel and cuBLAS's block-scaled GEMM (rows padded for it and cut back) against the twins
    run on the GPU, bf16 out: within the gate/up kernel's own difference (test_gate_up_silu_fp8)."""
    q, scale, w, w_scale = _gate_up_operands(m, k, n)
    down, down_scale = kernels.quantize_blocks_torch(torch.randn(hidden, n, device="cuda") / n**0.5)
    bias = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    args = (q.view(1, m, k), scale.view(1, m, 1), w, w_scale.t().contiguous(), down, down_scale, bias, torch.bfloat16)
    got = kernels.fp8_block_mlp(*args)
    with kernels.fused_enabled(False):
        want = kernels.fp8_block_mlp(*args)
    assert got.shape == want.shape == (1, m, hidden) and _rel(got, want) < 2e-2


ROPE_ATTENTION_CASES = [  # dtype, rows, positions, kept, heads, kv heads, head dim
    (torch.bfloat16, 2048, 11, 11, 16, 2, 128),  # the VoxCPM2 LocDiT's at 1,024 streams
    (torch.bfloat16, 2048, 11, 4, 16, 2, 128),  # its last layer
    (torch.float16, 37, 5, 5, 16, 2, 64),  # a LocEnc's
    (torch.bfloat16, 3, 1, 1, 8, 8, 32),
    (torch.float16, 5, 32, 7, 4, 2, 32),
]


@pytest.mark.parametrize(("dtype", "rows", "seq", "keep", "heads", "kv_heads", "dim"), ROPE_ATTENTION_CASES)
def test_rope_attention(
    dtype: torch.dtype, rows: int, seq: int, keep: int, heads: int, kv_heads: int, dim: int
) -> None:
    """RoPE, attention and the kept positions' rows in one kernel, at the engine's launch, both launch widths and with
    each kv head's queries split in two programs under a register cap of 128: against the twin (RoPE,
    then SDPA) and a float64 reference as test_dense_attention; with fp8, the e4m3 rows and scales that bounding its
    own model-dtype output gives (bounded_fp8_rows_torch)."""
    qkv = torch.randn(rows, seq, (heads + 2 * kv_heads) * dim, device="cuda", dtype=dtype)
    q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q, k, v = q.view(rows, seq, heads, dim), k.view(rows, seq, kv_heads, dim), v.view(rows, seq, kv_heads, dim)
    angle = torch.randn(seq, 1, dim // 2, device="cuda").repeat(1, 1, 2)
    cos, sin = (angle.cos() * 1.2).to(dtype), (angle.sin() * 1.2).to(dtype)  # LongRoPE scales its tables
    assert triton_ops.rope_attention_fits(q, k, v, cos, sin)
    scale = dim**-0.5
    twin = kernels.rope_attention_torch(q, k, v, cos, sin, scale, keep, False)
    exact = kernels.rope_attention_torch(
        q.double(), k.double(), v.double(), cos.double(), sin.double(), scale, keep, False
    )
    before = qkv.clone()
    half_group = max(1, heads // kv_heads // 2)  # each kv head's queries in two programs
    # The engine's launch (ROPE_ATTENTION_LARGE_GRID from 2,048 programs on), then others of the benchmark's sweep.
    for warps, block, registers in ((None, None, None), (4, None, None), (8, None, None), (4, half_group, 128)):
        got = triton_ops.rope_attention(q, k, v, cos, sin, scale, keep, False, warps, block, registers)
        assert got.shape == (rows, keep, heads * dim) and got.dtype == dtype and got.is_contiguous()
        assert _rel(got, twin) < 1e-2, (warps, block)
        assert _rel(got, exact) <= max(_rel(twin, exact), 1e-4) * 1.5, (warps, block)
        rows8, row_scale = triton_ops.rope_attention(q, k, v, cos, sin, scale, keep, True, warps, block, registers)
        want8, want_scale = kernels.bounded_fp8_rows_torch(got, v)
        assert torch.equal(row_scale, want_scale)
        assert torch.equal(rows8.float(), want8.float())  # the same IEEE roundings: a LoRA o_proj gets these rows
    assert torch.equal(qkv, before)  # q and k rotated as loaded, not in place
