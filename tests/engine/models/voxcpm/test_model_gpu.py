"""VoxCPMModel on CUDA (marker `gpu`): fp32 CUDA equals CPU, and the bf16 attention backends agree."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine import kernels
from engine.models.voxcpm import VoxCPMModel, build_prompt, load_voxcpm
from engine.models.voxcpm.checkpoint import released_shapes
from engine.models.voxcpm.config import parse_config
from engine.models.voxcpm.make_checkpoint import make_checkpoint, random_weights
from engine.params import Prompt
from tests.engine.models.voxcpm.driver import Driver, Seq

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
TEXT = "hello world, 你好 speech test"


def _generate(path: Path, device: str, dtype: torch.dtype, backend: str, patches: int) -> torch.Tensor:
    loaded = load_voxcpm(path, device, dtype, backend)
    config = loaded.config
    noise = torch.randn(patches, config.feat_dim, config.patch_size, generator=torch.Generator().manual_seed(0))
    latents = torch.randn(3, config.patch_size, config.feat_dim, generator=torch.Generator().manual_seed(1))
    packed = build_prompt(TEXT, Prompt(text="the voice", latents=latents.numpy()), loaded.tokenizer, config)
    seq = Seq(packed, noise)
    Driver(loaded.model, num_blocks=4, block_size=256).generate(seq, patches)
    return torch.stack(seq.patches).float().cpu()


def test_cuda_fp32_matches_cpu(tiny_checkpoint: Callable[..., Path]) -> None:
    path = tiny_checkpoint("voxcpm2")
    cpu = _generate(path, "cpu", torch.float32, "torch", 4)
    for backend in ("torch", "sdpa"):
        cuda = _generate(path, "cuda", torch.float32, backend, 4)
        # TF32 is off by default for matmuls in PyTorch, so this is an fp32-vs-fp32 comparison
        assert float((cuda - cpu).abs().max() / cpu.abs().max()) < 1e-4, backend


def _head_dim_64_checkpoint(out: Path) -> Path:
    """Tiny VoxCPM2 with head_dim 64 in every stack, a size the flash-attn build supports (tiny has 8)."""
    make_checkpoint("voxcpm2", "tiny", out)
    raw = json.loads((out / "config.json").read_text())
    for section in (raw["lm_config"], raw["encoder_config"], raw["dit_config"]):
        section["kv_channels"] = 64
    raw["lm_config"]["rope_scaling"]["short_factor"] = raw["lm_config"]["rope_scaling"]["long_factor"] = [1.0] * 32
    (out / "config.json").write_text(json.dumps(raw))
    with torch.device("meta"):
        shapes = released_shapes(VoxCPMModel(parse_config(raw)))
    save_file(random_weights(shapes, seed=0, dtype=torch.float32), str(out / "model.safetensors"))
    return out


def test_bf16_backends_agree(tmp_path: Path) -> None:
    path = _head_dim_64_checkpoint(tmp_path / "hd64")
    backends = ["torch", "sdpa"] + (["flash_attn"] if importlib.util.find_spec("flash_attn") else [])
    with kernels.fused_enabled(False):  # the attention backends are under test here (kernels: tests/engine/kernels)
        first = {b: _generate(path, "cuda", torch.bfloat16, b, 2) for b in backends}
    for backend, patch in first.items():
        assert torch.isfinite(patch).all()
        error = float((patch - first["torch"]).abs().max() / first["torch"].abs().max())
        assert error < 5e-2, f"{backend}: {error:.2e}"


def test_one_streams_solver_through_the_few_rows_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """One stream's LocDiT (22 rows: 2 guidance rows of 11 positions) at VoxCPM2's full size in bf16: the GEMMs of
    its layers go through the few-rows kernels (the o and down projections split K, gate/up applies SiLU*mul) but
    the last layer's o_proj, whose input is a strided view of the kept positions (cuBLAS reads it in place), and
    the solved patch stays within two bf16 implementations' distance of the twins' (cuBLAS and the torch
    elementwise ops): relative RMS 1e-2 (an actual fault is O(1))."""
    from engine.kernels import triton_ops
    from tests.engine.models.voxcpm.test_fp8 import _cfm

    cfm = _cfm("voxcpm2", "full", "cuda", torch.bfloat16)
    estimator = cfm.estimator
    gen = torch.Generator().manual_seed(1)
    latent = (1, estimator.patch_size, estimator.in_proj.in_features)
    mu = torch.randn(1, estimator.mu_tokens * estimator.hidden, generator=gen).cuda().bfloat16()
    cond = torch.randn(latent, generator=gen).cuda().bfloat16()
    noise = torch.randn(latent, generator=gen).cuda()
    args = (torch.ones(1, device="cuda"), torch.full((1,), 2.0, device="cuda"), torch.full((1,), 10, device="cuda"))
    calls = {"linear": 0, "gated": 0}
    few_rows_linear = triton_ops.few_rows_linear

    def counted(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> torch.Tensor:
        calls["gated" if gated else "linear"] += 1
        return few_rows_linear(x, weight, gated)

    monkeypatch.setattr(triton_ops, "few_rows_linear", counted)
    passes = []
    estimator.decoder.register_forward_hook(lambda *_: passes.append(1))
    with torch.no_grad():
        fused = cfm(mu, cond, noise, *args, 10).float()
        with kernels.fused_enabled(False):
            twins = cfm(mu, cond, noise, *args, 10).float()
    layers, fused_passes = len(estimator.decoder.layers), len(passes) // 2
    assert fused_passes > 0 and calls == {"linear": fused_passes * (3 * layers - 1), "gated": fused_passes * layers}
    drift = float((fused - twins).pow(2).mean().sqrt() / twins.pow(2).mean().sqrt())
    print(f"few-rows kernels vs twins, one stream's patch: {drift:.5f}")
    assert drift < 1e-2
