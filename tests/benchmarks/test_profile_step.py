"""benchmarks/profile_step.py's kernel kinds, on kernel names its H100 profiles listed."""

from __future__ import annotations

import pytest

from benchmarks.profile_step import kernel_kind


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
