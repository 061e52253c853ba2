"""Loading a released VoxCPM checkpoint: directory layout, weight files, name mapping, strict checks.

Layout: config.json; model weights as `*.safetensors` (one file or shards) or `pytorch_model.bin` / `*.pt`
(converted on load); audiovae.safetensors or audiovae.pth ({"state_dict": ...}); tokenizer.json (+ configs).
A Hugging Face repo id is resolved with `huggingface_hub.snapshot_download` (engine/models/checkpoints.py).

Released names are unfused (`q_proj`, `k_proj`, `v_proj`, `gate_proj`, `up_proj`); the model fuses them into
`qkv_proj` / `gate_up_proj` here. Every unknown, missing or mis-shaped tensor is an error that names it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.attention import get_attention_backend
from engine.models.checkpoints import CheckpointError, resolve_checkpoint
from engine.models.voxcpm.audio_vae import AudioVAE, load_audio_vae
from engine.models.voxcpm.config import VoxCPMConfig, load_config
from engine.models.voxcpm.minicpm4 import Attention
from engine.models.voxcpm.model import VoxCPMModel
from engine.models.voxcpm.state_dict import mismatches, name_list
from engine.models.voxcpm.tokenizer import VoxCPMTokenizer

# fused module name -> the released module names it concatenates along dim 0
FUSED: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


@dataclass(frozen=True, slots=True)
class LoadedVoxCPM:
    model: VoxCPMModel
    vae: AudioVAE
    tokenizer: VoxCPMTokenizer
    config: VoxCPMConfig
    path: Path  # the resolved checkpoint directory
    vae_sha256: str  # of the AudioVAE weights file: what encoded latents are bound to


def released_layout(model: nn.Module) -> dict[str, list[tuple[str, torch.Size]]]:
    """For every model tensor, the released tensors (name, shape) it is made of, in concatenation order."""
    layout: dict[str, list[tuple[str, torch.Size]]] = {}
    for name, tensor in model.state_dict().items():
        owner, module, leaf = name.rsplit(".", 2) if name.count(".") >= 2 else ("", *name.rsplit(".", 1))
        if module not in FUSED:
            layout[name] = [(name, tensor.shape)]
            continue
        parent = model.get_submodule(owner)
        sizes = parent.split if isinstance(parent, Attention) else [tensor.shape[0] // 2] * 2
        layout[name] = [
            (f"{owner}.{part}.{leaf}", torch.Size((size, *tensor.shape[1:])))
            for part, size in zip(FUSED[module], sizes, strict=True)
        ]
    return layout


def released_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """Names and shapes of the released model.safetensors for this model."""
    return {name: shape for parts in released_layout(model).values() for name, shape in parts}


def load_weights(
    model: nn.Module, tensors: dict[str, tuple[torch.Size, Callable[[], torch.Tensor]]], source: str
) -> None:
    """Copy released tensors (name -> (shape, loader)) into the model, strictly; loaders are called lazily."""
    problems = mismatches({name: shape for name, (shape, _) in tensors.items()}, released_shapes(model))
    if problems:
        raise CheckpointError(f"{source} does not match the {type(model).__name__}: {problems}")
    params = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, parts in released_layout(model).items():
            target = params[name]
            offset = 0
            for part, shape in parts:
                target[offset : offset + shape[0]].copy_(tensors[part][1]())
                offset += shape[0]


def _iter_model_files(directory: Path) -> Iterator[Path]:
    shards = sorted(p for p in directory.glob("*.safetensors") if p.name != "audiovae.safetensors")
    if shards:
        yield from shards
        return
    legacy = directory / "pytorch_model.bin"
    if legacy.is_file():
        yield legacy
        return
    yield from sorted(p for p in directory.glob("*.pt"))


def read_model_tensors(directory: Path) -> dict[str, tuple[torch.Size, Callable[[], torch.Tensor]]]:
    """Index every model tensor of a checkpoint directory without loading it (safetensors or torch pickles)."""
    tensors: dict[str, tuple[torch.Size, Callable[[], torch.Tensor]]] = {}
    files = list(_iter_model_files(directory))
    if not files:
        raise CheckpointError(f"no model weights (*.safetensors, pytorch_model.bin or *.pt) in {directory}")
    for file in files:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            handle = safe_open(str(file), framework="pt")
            entries = {
                k: (torch.Size(handle.get_slice(k).get_shape()), lambda h=handle, k=k: h.get_tensor(k))
                for k in handle.keys()  # noqa: SIM118 - safe_open handles are not iterable
            }
        else:
            # mmap keeps a multi-GB pickle out of RAM until each tensor is copied into the model.
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
                state = state["state_dict"]
            entries = {k: (v.shape, lambda v=v: v) for k, v in state.items()}
        duplicated = sorted(entries.keys() & tensors.keys())
        if duplicated:
            raise CheckpointError(f"tensors stored twice ({file.name}): {name_list(duplicated)}")
        tensors.update(entries)
    return tensors


def _vae_file(directory: Path) -> Path:
    for name in ("audiovae.safetensors", "audiovae.pth"):
        if (directory / name).is_file():
            return directory / name
    raise CheckpointError(f"no audiovae.safetensors or audiovae.pth in {directory}")


def build_model(
    config: VoxCPMConfig, device: torch.device | str, dtype: torch.dtype, attention_backend: str = "auto"
) -> VoxCPMModel:
    """An uninitialised model on `device`/`dtype` (parameters allocated, not filled; RoPE tables filled)."""
    with torch.device("meta"):
        model = VoxCPMModel(config, get_attention_backend(attention_backend, device))
    # Cast while still on meta so that full-size fp32 parameters are never allocated for a bf16 model.
    model.to(dtype).to_empty(device=device)
    model.fill_rope_tables()
    return model.eval().requires_grad_(False)


def load_voxcpm(
    path_or_repo: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    attention_backend: str = "auto",
) -> LoadedVoxCPM:
    """Load model, AudioVAE (fp32, weight norm folded), tokenizer and config. dtype None: bf16 on CUDA, else fp32."""
    directory = resolve_checkpoint(path_or_repo)
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = load_config(directory)
    model = build_model(config, device, dtype, attention_backend)
    load_weights(model, read_model_tensors(directory), str(directory))
    vae_file = _vae_file(directory)
    vae = load_audio_vae(vae_file, config.audio_vae_config, device=device)
    with vae_file.open("rb") as f:
        vae_sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    return LoadedVoxCPM(model, vae, VoxCPMTokenizer.from_dir(directory), config, directory, vae_sha256)
