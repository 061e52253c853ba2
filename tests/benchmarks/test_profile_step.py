"""benchmarks/profile_step.py's kernel kinds, on kernel names its H100 profiles listed, and its count of a piece's
matrix work."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from benchmarks import profile_step
from benchmarks.profile_step import gflop, kernel_kind
from engine.engine_core import EngineCore
from tests.engine.helpers import engine_config


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT", "gemm"),
        ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false", "attention"),
        ("_dense_attention_kernel", "attention"),
        ("_silu_mul_fp8_kernel", "fused_triton"),  # counted as "other" until the FP8 kernels came
        ("_quantize_rows_kernel", "fused_triton"),
        ("_dwconv_snake_kernel", "fused_triton"),
        ("sm90_xmma_dgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x256x64_w", "conv"),
        ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816dgrad_optimized_f16_256x64_32x4_", "conv"),
        ("nvjet_sm90_hsh_320x128_64x3_1x2_h_bz_coopB_NNT", "gemm"),
        ("void cudnn::engines_precompiled::nhwcToNchwKernel<__half, __half, float, true, false, (cud", "conv"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespa", "other"),
        ("Memset (Device)", "other"),
    ],
)
def test_kernel_kind(name: str, kind: str) -> None:
    assert kernel_kind(name) == kind


def test_gflop_counts_gemms_and_convolutions_and_not_element_wise_work() -> None:
    linear, conv = torch.nn.Linear(64, 32), torch.nn.Conv1d(16, 8, kernel_size=3)
    x, signal = torch.randn(8, 64), torch.randn(2, 16, 100)

    def piece() -> object:
        return torch.relu(linear(x)).sum(), conv(signal) * 2

    # 2 FLOPs a multiply-add: 8 x 64 x 32 for the GEMM, 2 x 8 x 98 outputs of 16 x 3 for the convolution
    assert gflop(piece) * 1e9 == pytest.approx(2 * 8 * 64 * 32 + 2 * (2 * 8 * 98) * (16 * 3))


def test_gflop_counts_grouped_query_attention_as_whole_heads() -> None:
    """The twins' attention has fewer key/value heads than query heads: torch's formula refused it on the GPU."""
    q, k, v = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)

    def piece() -> object:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    # Q K^T and P V for each of the 8 query heads: 2 x (5 x 16 x 7) and 2 x (5 x 7 x 16) per head and batch row
    assert gflop(piece) * 1e9 == pytest.approx(2 * 8 * (2 * 5 * 16 * 7 + 2 * 5 * 7 * 16))


def test_a_profile_line_on_the_cpu_with_wall_clock_timing(
    tiny_checkpoint: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole profile of one batch size, its CUDA timers swapped for the wall clock: every piece the GPU times runs,
    and the counted work adds up (the script runs only on GPUs otherwise, where a broken piece costs a device call)."""
    monkeypatch.setattr(profile_step, "graph_ms", lambda *fns, iters=10: sum(profile_step.wall_ms(f, 1) for f in fns))
    monkeypatch.setattr(profile_step, "kernel_breakdown", lambda fn, top: {})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    config = engine_config(tiny_checkpoint("voxcpm2", stop=False), max_num_seqs=2, max_model_len=128)
    with torch.inference_mode():
        line = profile_step.profile(EngineCore(config), batch=2, steps=2, top=0)
    work = line["gflop"]
    assert work["step"] > work["cfm"] > work["locdit_call"] > 0 and work["vae"] > 0 and work["backbone"] > 0
    assert work["backbone"] == pytest.approx(work["step"] - work["cfm"] - work["vae"], abs=1e-3)
    assert set(line["tflops"]) == set(work) and all(rate >= 0 for rate in line["tflops"].values())
    assert line["gflop_per_audio_s"] > 0
    assert line["cfm_vae_overlapped"] > 0
