"""The reference implementation (voxcpm 2.0.3) for parity tests, imported with a minimal shim.

`voxcpm.model.voxcpm` imports torchaudio at module level, and there is no CPU torchaudio wheel for this torch; the
model parity tests never pass it a file (prompt latents go straight into the model). So torchaudio (and librosa,
which `voxcpm.model.voxcpm2` reads files with, where it is not installed) is stubbed by an empty module for the
duration of the import and removed again, so that no other test sees it. The voice parity tests need the real
librosa (scripts/setup.sh --test installs it). transformers is imported first because it probes for torchaudio
at import time and must see the truth.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch


def reference_models() -> tuple[type, type]:
    """(VoxCPMModel, VoxCPM2Model) of the reference package."""
    if importlib.util.find_spec("voxcpm") is None:
        # In CI the parity tests must run: a missing reference is a broken install, not a reason to skip.
        if os.environ.get("CI"):
            pytest.fail("the reference package voxcpm is not installed (scripts/setup.sh --test installs it)")
        pytest.skip("the reference package voxcpm is not installed")
    import transformers  # noqa: F401

    added = [name for name in ("torchaudio", "librosa") if importlib.util.find_spec(name) is None]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    try:
        from voxcpm.model.voxcpm import VoxCPMModel
        from voxcpm.model.voxcpm2 import VoxCPM2Model
    finally:
        for name in added:
            del sys.modules[name]
    return VoxCPMModel, VoxCPM2Model


def load_reference(checkpoint: Path, tmp: Path, lora: Path | None = None) -> torch.nn.Module:
    """The reference model of a checkpoint, in fp32 on the CPU; with `lora` (an adapter directory in the released
    layout) its LoRAConfig injected and its weights loaded, every tensor of the file used.

    from_local casts the model (RoPE tables included) to config.json's dtype, so it reads a copy whose config
    says float32.
    """
    v1, v2 = reference_models()
    copy = tmp / f"{checkpoint.name}-fp32"
    if not copy.exists():
        shutil.copytree(checkpoint, copy)
        config = json.loads((copy / "config.json").read_text())
        config["dtype"] = "float32"
        (copy / "config.json").write_text(json.dumps(config))
    architecture = json.loads((copy / "config.json").read_text())["architecture"]
    cls = v2 if architecture == "voxcpm2" else v1
    if lora is None:
        return cls.from_local(str(copy), optimize=False, device="cpu").eval()
    config_cls = sys.modules[cls.__module__].LoRAConfig
    lora_config = config_cls(**json.loads((lora / "lora_config.json").read_text())["lora_config"])
    model = cls.from_local(str(copy), optimize=False, device="cpu", lora_config=lora_config).eval()
    loaded, skipped = model.load_lora_weights(str(lora), device="cpu")
    assert loaded and not skipped, f"the reference skipped adapter tensors: {skipped}"
    return model
