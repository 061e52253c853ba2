"""Checkpoint generator and loader: the reference loads our files strictly, and our loader's errors name tensors."""

from __future__ import annotations

import json
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.models.voxcpm import CheckpointError, load_voxcpm
from engine.models.voxcpm.checkpoint import released_shapes, resolve_checkpoint
from engine.models.voxcpm.make_checkpoint import make_config
from tests.engine.models.voxcpm.reference import load_reference

VARIANTS = ["voxcpm-0.5b", "voxcpm1.5", "voxcpm2"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_loads_checkpoint_strictly(
    variant: str, tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    """The reference loads with strict=False, so compare every key and shape of its state dict ourselves."""
    path = tiny_checkpoint(variant)
    ref = load_reference(path, tmp_path)
    ref_state = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        model_file = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    vae_file = {f"audio_vae.{k}": tuple(v.shape) for k, v in torch.load(path / "audiovae.pth")["state_dict"].items()}
    assert ref_state == model_file | vae_file
    # and the file is exactly what our model expects
    loaded = load_voxcpm(path, "cpu", torch.float32)
    assert {k: tuple(v) for k, v in released_shapes(loaded.model).items()} == model_file


def test_full_size_configs_match_the_release() -> None:
    """Tensor counts and parameter totals of the full sizes equal the released checkpoints (brief §1.1)."""
    from engine.models.voxcpm.config import parse_config
    from engine.models.voxcpm.model import VoxCPMModel

    expected = {
        "voxcpm-0.5b": (377, 652_287_296, 15_360),
        "voxcpm1.5": (449, 771_841_344, 15_360),
        "voxcpm2": (577, 2_290_004_544, 36_864),
    }
    for variant, (count, params, kv_bytes) in expected.items():
        with torch.device("meta"):
            model = VoxCPMModel(parse_config(make_config(variant, "full"))).to(torch.bfloat16)
        shapes = released_shapes(model)
        assert (len(shapes), sum(s.numel() for s in shapes.values())) == (count, params), variant
        assert model.kv_cache_bytes_per_token() == kv_bytes, variant


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_weights(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda sd: sd.update({"base_lm.layers.0.self_attn.bogus.weight": torch.zeros(2)}), "unknown tensors: "),
        (lambda sd: sd.pop("feat_encoder.encoder.layers.1.mlp.up_proj.weight"), "missing tensors: "),
        (lambda sd: sd.update({"stop_head.weight": torch.zeros(3, 128)}), "wrong shapes: "),
    ],
)
def test_loader_errors_name_the_tensor(
    edit: Callable, message: str, tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    path = _copy(tiny_checkpoint("voxcpm2"), tmp_path / "ckpt")
    _edit_weights(path, edit)
    with pytest.raises(CheckpointError) as info:
        load_voxcpm(path)
    text = str(info.value)
    assert message in text
    name = {"unknown": "base_lm.layers.0.self_attn.bogus.weight", "missing": "layers.1.mlp.up_proj.weight"}.get(
        message.split()[0], "stop_head.weight (3, 128) (expected (2, 128))"
    )
    assert name in text


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_pytorch_bin_and_sharded_layouts_load(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    src = tiny_checkpoint("voxcpm-0.5b")
    baseline = load_voxcpm(src, "cpu", torch.float32).model
    tensors = load_file(str(src / "model.safetensors"))

    legacy = _copy(src, tmp_path / "bin")
    (legacy / "model.safetensors").unlink()
    torch.save(tensors, legacy / "pytorch_model.bin")  # VoxCPM-0.5B ships this way
    assert _same_weights(load_voxcpm(legacy, "cpu", torch.float32).model, baseline)

    sharded = _copy(src, tmp_path / "sharded")
    (sharded / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[::2]}, str(sharded / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[1::2]}, str(sharded / "model-00002-of-00002.safetensors"))
    assert _same_weights(load_voxcpm(sharded, "cpu", torch.float32).model, baseline)


def test_loader_converts_dtype_and_reads_vae_safetensors(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint("voxcpm2"), tmp_path / "ckpt")
    state = torch.load(path / "audiovae.pth")["state_dict"]
    (path / "audiovae.pth").unlink()
    save_file(state, str(path / "audiovae.safetensors"))
    loaded = load_voxcpm(path, "cpu", torch.bfloat16)
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.model.base_lm.rope.cos.dtype == torch.bfloat16  # rounded like the reference's model.to(bf16)
    assert next(loaded.vae.parameters()).dtype == torch.float32


def test_missing_files_and_bad_paths(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint("voxcpm-0.5b"), tmp_path / "ckpt")
    (path / "audiovae.pth").unlink()
    with pytest.raises(CheckpointError, match="audiovae"):
        load_voxcpm(path)
    with pytest.raises(CheckpointError, match="neither a checkpoint directory"):
        resolve_checkpoint(tmp_path / "nowhere")


def test_hugging_face_repo_ids(
    tiny_checkpoint: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A repo id goes through huggingface_hub.snapshot_download; without the package the error says so."""
    path = tiny_checkpoint("voxcpm2")
    hub = types.ModuleType("huggingface_hub")
    hub.snapshot_download = lambda repo_id: str(path) if repo_id == "openbmb/VoxCPM2" else None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    monkeypatch.chdir(tmp_path)  # so that "openbmb/VoxCPM2" is not a local directory
    assert resolve_checkpoint("openbmb/VoxCPM2") == path
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(CheckpointError, match="needs huggingface_hub"):
        resolve_checkpoint("openbmb/VoxCPM2")


def test_generator_config_has_no_nulls_and_no_stop_disables_stop(tmp_path: Path) -> None:
    from engine.models.voxcpm.make_checkpoint import make_checkpoint

    path = make_checkpoint("voxcpm-0.5b", "tiny", tmp_path / "ns", seed=3, no_stop=True)
    raw = (path / "config.json").read_text()
    assert "null" not in raw and json.loads(raw)["architecture"] == "voxcpm"
    weights = load_file(str(path / "model.safetensors"))
    assert torch.all(weights["stop_proj.weight"] == 0) and torch.all(weights["stop_proj.bias"] == 4)
    hidden = torch.randn(16, weights["stop_proj.weight"].shape[0])
    logits = torch.nn.functional.silu(hidden @ weights["stop_proj.weight"].T + weights["stop_proj.bias"])
    assert not (logits @ weights["stop_head.weight"].T).argmax(-1).any()
