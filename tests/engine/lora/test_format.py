"""The adapter reader: the released layout round-trips, and every bad adapter fails naming what is wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.lora.format import CONFIG_FILE, WEIGHTS_FILE, AdapterError, read_adapter
from engine.lora.make_adapter import checkpoint_targets, make_adapter


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint("voxcpm2")


@pytest.fixture
def adapter(checkpoint: Path, tmp_path: Path) -> Path:
    return make_adapter(checkpoint, tmp_path / "adapter", rank=4, alpha=8, groups=("lm", "dit", "proj"))


def _edit_config(adapter: Path, **changes: object) -> None:
    meta = json.loads((adapter / CONFIG_FILE).read_text())
    meta["lora_config"].update(changes)
    (adapter / CONFIG_FILE).write_text(json.dumps(meta))


def _edit_weights(adapter: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(str(adapter / WEIGHTS_FILE))
    edit(tensors)
    save_file(tensors, str(adapter / WEIGHTS_FILE))


def test_round_trip(checkpoint: Path, adapter: Path) -> None:
    got = read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)
    assert got.rank == 4 and got.config.scaling == 2.0
    assert got.short_names() == {"q_proj", "k_proj", "v_proj", "o_proj", "enc_to_lm_proj", "lm_to_dit_proj"} | {
        "res_to_dit_proj",
        "fusion_concat_proj",
    }
    a, b = got.weights["base_lm.layers.0.self_attn.k_proj"]
    assert a.shape[0] == 4 and b.shape[1] == 4 and a.dtype == torch.float32
    assert "feat_decoder.estimator.decoder.layers.0.self_attn.o_proj" in got.weights
    assert not any(path.startswith("feat_encoder") for path in got.weights)  # voxcpm never targets LocEnc


def test_rank_above_the_engine_max(checkpoint: Path, adapter: Path) -> None:
    with pytest.raises(AdapterError, match="rank r = 4 exceeds this engine's max LoRA rank 2"):
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=2)


def test_wrong_rank_names_the_tensor(checkpoint: Path, adapter: Path) -> None:
    _edit_config(adapter, r=8)
    with pytest.raises(AdapterError, match=r"wrong shapes: base_lm\.layers\.0\.self_attn\.k_proj\.lora_A \(4, "):
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True])
def test_rank_must_be_a_positive_integer(checkpoint: Path, adapter: Path, bad: object) -> None:
    _edit_config(adapter, r=bad)
    with pytest.raises(AdapterError, match="rank r must be a positive integer"):
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)


def test_unknown_target_module(checkpoint: Path, adapter: Path) -> None:
    _edit_config(adapter, target_modules_dit=["q_proj", "qkv"])
    with pytest.raises(AdapterError, match=r"unknown target module.*target_modules_dit: qkv"):
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)


def test_shape_mismatch_names_the_tensor(checkpoint: Path, adapter: Path) -> None:
    name = "feat_decoder.estimator.decoder.layers.1.self_attn.o_proj.lora_B"
    _edit_weights(adapter, lambda t: t.update({name: torch.zeros(3, 4)}))
    with pytest.raises(AdapterError, match=rf"wrong shapes: {name} \(3, 4\) \(expected \("):
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)


def test_unknown_and_missing_tensors_are_named(checkpoint: Path, adapter: Path) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t["base_lm.layers.0.mlp.gate_proj.lora_A"] = torch.zeros(4, 4)  # not selected by the config
        del t["residual_lm.layers.0.self_attn.v_proj.lora_B"]

    _edit_weights(adapter, edit)
    with pytest.raises(AdapterError) as info:
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)
    assert "unknown tensors: base_lm.layers.0.mlp.gate_proj.lora_A" in str(info.value)
    assert "missing tensors: residual_lm.layers.0.self_attn.v_proj.lora_B" in str(info.value)


def test_non_finite_weights(checkpoint: Path, adapter: Path) -> None:
    name = "base_lm.layers.0.self_attn.q_proj.lora_A"
    _edit_weights(adapter, lambda t: t[name].view(-1).__setitem__(0, float("nan")))
    with pytest.raises(AdapterError, match=f"{name} holds non-finite values"):
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / CONFIG_FILE).unlink(), "missing lora_config.json"),
        (lambda d: (d / WEIGHTS_FILE).unlink(), "missing lora_weights.safetensors"),
        (lambda d: (d / CONFIG_FILE).write_text("{"), "not valid JSON"),
        (lambda d: (d / CONFIG_FILE).write_text("{}"), "with a 'lora_config' entry"),
        (lambda d: (d / WEIGHTS_FILE).write_bytes(b"garbage"), "not a readable safetensors file"),
    ],
)
def test_broken_files(checkpoint: Path, adapter: Path, damage: Callable[[Path], None], message: str) -> None:
    damage(adapter)
    with pytest.raises(AdapterError, match=message):
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"alpha": 0}, "alpha must be a positive number"),
        ({"enable_lm": "yes"}, "enable_lm must be true or false"),
        ({"lora_scale": 2}, "unknown lora_config settings: lora_scale"),
        ({"enable_lm": False, "enable_dit": False, "enable_proj": False}, "targets no module"),
    ],
)
def test_bad_settings(checkpoint: Path, adapter: Path, changes: dict, message: str) -> None:
    _edit_config(adapter, **changes)
    with pytest.raises(AdapterError, match=message):
        read_adapter(adapter, checkpoint_targets(checkpoint), max_rank=8)
