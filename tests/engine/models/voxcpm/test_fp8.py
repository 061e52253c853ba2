"""FP8 LocDiT GEMMs (EngineConfig.fp8_gemms): which linears they replace, that the engine (and LoRA) runs on them,
and their drift from the model dtype. CPU runs the same code path (torch._scaled_mm has a CPU kernel); the GPU test
bounds the drift at full size, where it is stated (docs/engine.md)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from engine import kernels
from engine.attention import get_attention_backend
from engine.engine_core import EngineCore
from engine.lora.linear import AdapterRows, LoRALinear, Part, Site
from engine.lora.make_adapter import make_adapter
from engine.models import layers
from engine.models.layers import Fp8Linear
from engine.models.voxcpm import make_checkpoint as make_checkpoint_module
from engine.models.voxcpm.cfm import CFM
from engine.models.voxcpm.config import parse_config
from engine.models.voxcpm.locdit import LocDiT
from engine.models.voxcpm.make_checkpoint import make_config
from engine.models.voxcpm.minicpm4 import FP8_LINEARS
from engine.params import GenerationParams, GenerationRequest
from tests.engine.helpers import engine_config
from tests.engine.test_cuda_graphs import _run_mixed_steps

# Relative RMS of a solved patch, FP8 against the model dtype, full-size random VoxCPM2 LocDiT in bf16 (GPU test).
FULL_SIZE_PATCH_DRIFT = 0.05


def _cfm(variant: str, size: str, device: str, dtype: torch.dtype, ffn: int | None = None) -> CFM:
    """A randomly initialised solver (nn.Linear's own init) of a variant's LocDiT (with `ffn`, that MLP width)."""
    raw = make_config(variant, size)
    if ffn is not None:
        raw["dit_config"]["ffn_dim"] = ffn
    config = parse_config(raw)
    torch.manual_seed(0)
    with torch.device(device):
        estimator = LocDiT(
            config.local_stack(config.dit_config),
            config.feat_dim,
            config.patch_size,
            mu_tokens=2 if config.is_v2 else 0,
            backend=get_attention_backend("torch", device),
        )
    return CFM(estimator.to(dtype), config.mean_mode).eval()


def _fp8_copy(cfm: CFM) -> CFM:
    fp8 = copy.deepcopy(cfm)
    fp8.estimator.use_fp8()
    return fp8


def _patch_drift(cfm: CFM, rows: int, timesteps: int = 10) -> float:
    """Relative RMS between the patches the model-dtype solver and its FP8 copy solve from the same inputs (cfg 2)."""
    fp8 = _fp8_copy(cfm)
    estimator, device, dtype = cfm.estimator, cfm.estimator.in_proj.weight.device, cfm.estimator.in_proj.weight.dtype
    gen = torch.Generator().manual_seed(1)
    latent = (rows, estimator.patch_size, estimator.in_proj.in_features)
    mu = torch.randn(rows, max(1, estimator.mu_tokens) * estimator.hidden, generator=gen).to(device, dtype)
    cond = torch.randn(latent, generator=gen).to(device, dtype)
    noise = torch.randn(latent, generator=gen).to(device)
    args = (torch.ones(rows, device=device), torch.full((rows,), 2.0, device=device))
    steps = torch.full((rows,), timesteps, device=device)
    with torch.no_grad():
        base = cfm(mu, cond, noise, *args, steps, timesteps).float()
        quantised = fp8(mu, cond, noise, *args, steps, timesteps).float()
    assert torch.isfinite(quantised).all()
    return float((quantised - base).pow(2).mean().sqrt() / base.pow(2).mean().sqrt())


def test_use_fp8_replaces_the_decoder_linears_only() -> None:
    estimator = _cfm("voxcpm2", "tiny", "cpu", torch.float32).estimator
    names = set(estimator.state_dict())
    estimator.use_fp8()
    for layer in estimator.decoder.layers:
        linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        assert all(type(linear) is Fp8Linear for linear in linears)
        assert all(linear.fp8.weight.dtype == torch.float8_e4m3fn for linear in linears)
        assert all(linear.weight.dtype == torch.float32 for linear in linears)  # kept for small batches
    assert len(FP8_LINEARS) == len(linears)
    assert type(estimator.in_proj) is nn.Linear and type(estimator.time_mlp.linear_1) is nn.Linear
    assert set(estimator.state_dict()) == names  # same parameter paths (LoRA sites, checkpoint names)


@pytest.fixture
def fp8_at_any_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """FP8 from the first row: the tiny models' batches are below FP8_MIN_ROWS."""
    monkeypatch.setattr(layers, "FP8_MIN_ROWS", 0)


def test_small_batches_multiply_in_the_model_dtype() -> None:
    linear = nn.Linear(32, 48)
    fp8 = Fp8Linear(linear)
    with torch.no_grad():
        small = torch.randn(layers.FP8_MIN_ROWS - 1, 32)
        assert torch.equal(fp8(small), linear(small))
        large = torch.randn(2, layers.FP8_MIN_ROWS // 2, 32)
        assert not torch.equal(fp8(large), linear(large))
        torch.testing.assert_close(fp8(large), linear(large), rtol=0.1, atol=0.1)


def test_a_weights_own_row_minimum_decides() -> None:
    linear = nn.Linear(32, 48)
    fp8 = Fp8Linear(linear, min_rows=8)
    with torch.no_grad():
        small, large = torch.randn(7, 32), torch.randn(8, 32)
        assert torch.equal(fp8(small), linear(small)) and not fp8.takes_fp8(small)
        assert not torch.equal(fp8(large), linear(large)) and fp8.takes_fp8(large)
        assert layers.multiplies_fp8(fp8, 8) and not layers.multiplies_fp8(fp8, 7)


@pytest.mark.usefixtures("fp8_at_any_batch")
@pytest.mark.parametrize("variant", ["voxcpm2", "voxcpm1.5"])
def test_fp8_patch_stays_close_on_cpu(variant: str) -> None:
    """The tiny fp32 model solved with FP8 GEMMs: close to fp32, and not equal (the FP8 path ran)."""
    drift = _patch_drift(_cfm(variant, "tiny", "cpu", torch.float32), rows=6)
    assert 0 < drift < 0.1, drift


class _SelfQuantising(Fp8Linear):
    """An Fp8Linear its producers do not recognise (takes_fp8 is False): it quantises its own input, as before the
    norms wrote e4m3 rows."""


@pytest.mark.usefixtures("fp8_at_any_batch")
def test_norms_write_the_e4m3_rows_of_their_fp8_linears(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each norm whose GEMM runs in FP8 (qkv, gate/up) hands it Fp8Rows from the norm's own kernel: the same bits as
    quantising the normed rows in a pass of their own. The attention writes o_proj's rows itself (its bound-scaled
    rows: test_attention_writes_bound_scaled_rows), so no quantising pass is left."""
    estimator = _cfm("voxcpm2", "tiny", "cpu", torch.float32).estimator
    estimator.use_fp8()
    unfused = copy.deepcopy(estimator)
    for name, module in unfused.decoder.named_modules():
        if type(module) is Fp8Linear and not name.endswith("o_proj"):
            module.__class__ = _SelfQuantising
    gen = torch.Generator().manual_seed(2)
    rows, hidden = 6, estimator.hidden
    x = torch.randn(rows, estimator.patch_size, estimator.in_proj.in_features, generator=gen)
    time = torch.randn(rows, hidden, generator=gen)
    mu = torch.randn(rows // 2, estimator.mu_tokens * hidden, generator=gen)
    cond = torch.randn(rows // 2, estimator.patch_size, estimator.in_proj.in_features, generator=gen)
    counted = {"quantize_rows": 0, "rms_norm_fp8": 0, "add_rms_norm_fp8": 0}
    for name in counted:
        original = getattr(kernels, name)

        def spy(*args: torch.Tensor, _name: str = name, _original: Callable = original) -> object:
            counted[_name] += 1
            return _original(*args)

        monkeypatch.setattr(kernels, name, spy)
    with torch.no_grad():
        fused = estimator(x, time, *estimator.context(mu, cond))
        calls = dict(counted)
        reference = unfused(x, time, *unfused.context(mu, cond))
    torch.testing.assert_close(fused, reference, rtol=0, atol=0)
    layers_ = len(estimator.decoder.layers)
    # First norm, then per layer the post-attention norm and (but the last) the next layer's input norm.
    assert calls == {"quantize_rows": 0, "rms_norm_fp8": 1, "add_rms_norm_fp8": 2 * layers_ - 1}
    # Unrecognised, every linear quantises its own input: qkv, gate/up and down (SiLU*mul's kernel no longer does).
    assert counted["quantize_rows"] == 3 * layers_


@pytest.mark.usefixtures("fp8_at_any_batch")
def test_block_scaled_down_weights_take_the_gate_up_kernels_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny LocDiT with whole blocks (hidden 128, ffn 512: four 128-blocks along the down projection's K, as
    cuBLAS wants them): each MLP hands its norm's e4m3 rows to fp8_block_mlp, with no SiLU*mul pass; the velocity
    is the rowwise path's within FP8 precision. The released tiny sizes (ffn 128 and 256) keep the rowwise path."""
    assert all(layer.mlp.down_proj.fp8_blocks is None for layer in _fp8_decoder("voxcpm2").layers)
    assert all(layer.mlp.down_proj.fp8_blocks is None for layer in _fp8_decoder("voxcpm1.5").layers)
    decoder = _fp8_decoder("voxcpm1.5", ffn=512)
    mlps = [layer.mlp for layer in decoder.layers]
    assert all(mlp.down_proj.fp8_blocks is not None and mlp.gate_up_proj.fp8_blocks is None for mlp in mlps)
    rowwise = copy.deepcopy(decoder)
    for layer in rowwise.layers:
        layer.mlp.down_proj.fp8_blocks = None
    counted = dict.fromkeys(("fp8_block_mlp", "silu_mul_fp8"), 0)
    for name in counted:
        original = getattr(kernels, name)

        def spy(*args: object, _name: str = name, _original: Callable = original) -> object:
            counted[_name] += 1
            return _original(*args)

        monkeypatch.setattr(kernels, name, spy)
    x = torch.randn(6, 8, decoder.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        blocks = decoder(x, keep=4)
        assert counted == {"fp8_block_mlp": len(mlps), "silu_mul_fp8": 0}
        reference = rowwise(x, keep=4)
    assert counted["silu_mul_fp8"] == len(mlps)
    drift = float((blocks - reference).norm() / reference.norm())
    assert 0 < drift < 0.05, drift


def _fp8_decoder(variant: str, ffn: int | None = None) -> nn.Module:
    estimator = _cfm(variant, "tiny", "cpu", torch.float32, ffn).estimator
    estimator.use_fp8()
    return estimator.decoder


@pytest.mark.usefixtures("fp8_at_any_batch")
def test_fp8_linear_with_a_lora_adapter_is_the_fp8_product_plus_the_adapter() -> None:
    torch.manual_seed(0)  # the FP8 error's bound below holds for most draws, not all (1 in ~6 went over it)
    linear = nn.Linear(32, 48, bias=True)
    base = Fp8Linear(linear)
    rows = AdapterRows(slots=2)
    wrapped = LoRALinear(base, Site("proj", (Part("proj", 0, 48),), 32, "dit", "dit"), rank=4, rows=rows)
    assert wrapped.lora_a.dtype == torch.float32  # the activations' dtype, not the weight's
    a, b = torch.randn(4, 32), torch.randn(48, 4)
    wrapped.load(1, {"proj": (a, b)}, scaling=0.5)
    x = torch.randn(5, 32)
    with torch.no_grad():
        assert torch.equal(wrapped(x), base(x))  # no adapter index set: the FP8 product alone
        rows.dit = torch.tensor([1, 0, 1, 0, 0], dtype=torch.int32)
        expected = base(x) + (x @ a.t() @ b.t()) * 0.5 * rows.dit[:, None]
        torch.testing.assert_close(wrapped(x), expected, rtol=1e-5, atol=1e-4)
        error = (base(x) - linear(x)).abs().max() / linear(x).abs().max()
    assert 0 < float(error) < 0.05


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint("voxcpm2", stop=False)


def test_fp8_backbone_replaces_the_backbone_linears_only(checkpoint: Path) -> None:
    model = EngineCore(engine_config(checkpoint, fp8_backbone=True)).runner.model
    for stack in (model.base_lm, model.residual_lm, model.feat_encoder.encoder):
        for layer in stack.layers:
            linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            assert all(type(linear) is Fp8Linear for linear in linears)
    assert not any(type(module) is Fp8Linear for module in model.feat_decoder.modules())  # fp8_gemms is apart
    assert type(model.feat_encoder.in_proj) is nn.Linear and type(model.enc_to_lm_proj) is nn.Linear


def test_fp8_backbone_min_rows_reaches_the_backbone_alone(checkpoint: Path) -> None:
    config = engine_config(checkpoint, fp8_gemms=True, fp8_backbone=True, fp8_backbone_min_rows=4096)
    model = EngineCore(config).runner.model
    backbone = (model.base_lm, model.residual_lm, model.feat_encoder.encoder)
    assert all(m.fp8.min_rows == 4096 for stack in backbone for m in stack.modules() if type(m) is Fp8Linear)
    locdit = [m for m in model.feat_decoder.modules() if type(m) is Fp8Linear]
    assert locdit and all(m.fp8.min_rows is None for m in locdit)


@pytest.mark.usefixtures("fp8_at_any_batch")
def test_fp8_backbone_mlps_take_the_gate_up_kernels_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LMs' MLPs are block-scaled like the LocDiT's where their shapes have whole blocks (the released LMs'
    4,096 and 6,144 do; the tiny 256 does not, so this checkpoint's LMs are 512 wide): a prefill hands each norm's
    e4m3 rows to fp8_block_mlp, with no SiLU*mul pass, and a request's first patch stays near the fp32 engine's."""
    wide = make_config("voxcpm2", "tiny")
    wide["lm_config"]["intermediate_size"] = 512
    monkeypatch.setattr(make_checkpoint_module, "make_config", lambda variant, size: copy.deepcopy(wide))
    checkpoint = make_checkpoint_module.make_checkpoint("voxcpm2", "tiny", tmp_path / "wide", no_stop=True)
    fp8 = EngineCore(engine_config(checkpoint, fp8_backbone=True))
    model = fp8.runner.model
    backbone = [layer.mlp for stack in (model.base_lm, model.residual_lm) for layer in stack.layers]
    assert all(mlp.down_proj.fp8_blocks is not None for mlp in backbone)
    counted = dict.fromkeys(("fp8_block_mlp", "silu_mul_fp8"), 0)
    for name in counted:
        original = getattr(kernels, name)

        def spy(*args: object, _name: str = name, _original: Callable = original) -> object:
            counted[_name] += 1
            return _original(*args)

        monkeypatch.setattr(kernels, name, spy)
    first = {}
    for name, core in {"fp8": fp8, "fp32": EngineCore(engine_config(checkpoint))}.items():
        core.add_request(GenerationRequest(text="Hello there.", params=GenerationParams(seed=3, max_patches=1)))
        chunks = core.step()
        first[name] = chunks[0].latents
        if name == "fp8":  # the prefill, each LM layer once
            assert counted == {"fp8_block_mlp": len(backbone), "silu_mul_fp8": 0}, counted
    drift = np.sqrt(np.mean((first["fp8"] - first["fp32"]) ** 2) / np.mean(first["fp32"] ** 2))
    assert 0 < drift < 0.15, drift


@pytest.mark.usefixtures("fp8_at_any_batch")
@pytest.mark.parametrize(
    "fp8", [{"fp8_gemms": True}, {"fp8_backbone": True}, {"fp8_gemms": True, "fp8_backbone": True}], ids=str
)
def test_engine_with_fp8_gemms_and_lora(checkpoint: Path, tmp_path: Path, fp8: dict[str, bool]) -> None:
    """Mixed steps (admissions joining a running batch, mixed Euler steps) on FP8 GEMMs (the LocDiT's, the
    backbone's, both): every request's audio is finite, its first latent patch close to the fp32 engine's (the tiny
    random VAE then amplifies a difference some fivefold, so audio is not compared); an LM and DiT adapter still
    changes its requests, others are the FP8 base model's bit for bit."""
    adapter = make_adapter(checkpoint, tmp_path / "a", 4, 16, ("lm", "dit"), 0, scale=0.2)
    runs = {}
    for name, overrides in {"fp32": {}, "fp8": fp8}.items():
        runs[name] = _run_mixed_steps(EngineCore(engine_config(checkpoint, max_num_seqs=8, **overrides)))
    core = EngineCore(engine_config(checkpoint, max_num_seqs=8, max_loras=1, max_lora_rank=8, **fp8))
    core.load_lora("a", core.read_lora(adapter))
    adapted = _run_mixed_steps(core, {"r0": "a", "r3": "a"})
    for request_id, chunks in runs["fp8"].items():
        fp8 = np.stack([c[1] for c in chunks])
        assert np.isfinite(fp8).all() and fp8.shape == np.stack([c[1] for c in runs["fp32"][request_id]]).shape
        latent, reference = chunks[0][0], runs["fp32"][request_id][0][0]
        first = np.sqrt(np.mean((latent - reference) ** 2) / np.mean(reference**2))
        assert 0 < first < 0.15, (request_id, first)
        with_adapter = np.stack([c[1] for c in adapted[request_id]])
        if request_id in ("r0", "r3"):
            assert np.abs(with_adapter[0] - fp8[0]).max() > 1e-3, request_id
        else:
            np.testing.assert_array_equal(with_adapter, fp8, err_msg=request_id)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [64, 25])
def test_fp8_drift_at_full_size_on_gpu(rows: int) -> None:
    """Full-size random VoxCPM2 LocDiT in bf16, 10 Euler steps with guidance: FP8 against bf16 within
    FULL_SIZE_PATCH_DRIFT (the Triton quantising kernels, the block-scaled MLPs and cuBLAS's FP8 GEMMs, all as the
    engine runs them). 25 rows make 550 and 200 rows a GEMM, which the block-scaled MLP pads for cuBLAS."""
    bf16 = _cfm("voxcpm2", "full", "cuda", torch.bfloat16)
    assert all(layer.mlp.down_proj.fp8_blocks is not None for layer in _fp8_copy(bf16).estimator.decoder.layers)
    drift = _patch_drift(bf16, rows=rows)
    print(f"fp8 vs bf16 patch drift at {rows} rows {drift:.4f}")
    assert 0 < drift < FULL_SIZE_PATCH_DRIFT
