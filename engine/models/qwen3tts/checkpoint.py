"""Loading a released Qwen3-TTS 12 Hz checkpoint: directory (or Hugging Face repo id), strict tensor checks.

Layout: config.json, generation_config.json, model.safetensors (`talker.*`, Base: `speaker_encoder.*`),
vocab.json + merges.txt + tokenizer_config.json, speech_tokenizer/{config.json, model.safetensors
(`encoder.*`, `decoder.*`)}. Our modules carry the released names, so loading is a strict name/shape match:
every unknown, missing or mis-shaped tensor is an error naming it. The codec stays fp32 (as released), the
talker takes the requested dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.attention import get_attention_backend
from engine.models.checkpoints import CheckpointError, resolve_checkpoint
from engine.models.qwen3tts.codec_decoder import CodecDecoder
from engine.models.qwen3tts.codec_encoder import CodecEncoder
from engine.models.qwen3tts.config import Qwen3TTSConfig, load_config
from engine.models.qwen3tts.model import Qwen3TTSModel
from engine.models.qwen3tts.tokenizer import Qwen3TTSTokenizer
from engine.models.voxcpm.state_dict import mismatches

# fp16 rather than bf16: the same speed, and its 11-bit significand is TF32's, which cuDNN already rounds the fp32
# decoder's conv inputs to on CUDA; bf16's 8 bits cost ~4x the waveform error (random full-size decoder on the CPU,
# streamed: relative RMS 0.12 bf16, 0.027 fp16). Its range (65504) holds the decoder's activations (std ~8).
DECODER_CONV_DTYPE = torch.float16


@dataclass(frozen=True, slots=True)
class LoadedQwen3TTS:
    model: Qwen3TTSModel
    codec_decoder: CodecDecoder
    codec_encoder: CodecEncoder
    tokenizer: Qwen3TTSTokenizer
    config: Qwen3TTSConfig
    path: Path


def _read(file: Path) -> dict[str, tuple[torch.Size, object]]:
    from safetensors import safe_open

    if not file.is_file():
        raise CheckpointError(f"missing {file}")
    handle = safe_open(str(file), framework="pt")
    names = handle.keys()  # safe_open handles are not iterable
    return {k: (torch.Size(handle.get_slice(k).get_shape()), lambda h=handle, k=k: h.get_tensor(k)) for k in names}


def shapes(module: nn.Module, prefix: str = "") -> dict[str, torch.Size]:
    """The released tensor names and shapes a module expects (its state dict, persistent tensors only)."""
    return {prefix + name: t.shape for name, t in module.state_dict().items()}


def load_strict(modules: dict[str, nn.Module], tensors: dict[str, tuple[torch.Size, object]], source: str) -> None:
    """Fill modules (prefix -> module) from released tensors; the union of their names must match exactly."""
    expected: dict[str, torch.Size] = {}
    for prefix, module in modules.items():
        expected.update(shapes(module, prefix))
    problems = mismatches({name: shape for name, (shape, _) in tensors.items()}, expected)
    if problems:
        raise CheckpointError(f"{source} does not match the model: {problems}")
    with torch.no_grad():
        for prefix, module in modules.items():
            params = module.state_dict(keep_vars=True)
            for name, target in params.items():
                target.copy_(tensors[prefix + name][1]())


def build_modules(config: Qwen3TTSConfig, device: torch.device | str, dtype: torch.dtype, attention_backend: str):
    """Uninitialised model (dtype) and codec (fp32) on `device`."""
    device = torch.device(device)
    with torch.device("meta"):
        model = Qwen3TTSModel(config, get_attention_backend(attention_backend, device))
        decoder = CodecDecoder(config.codec_decoder)
        encoder = CodecEncoder(config.codec_encoder)
    model = model.to(dtype).to_empty(device=device).eval().requires_grad_(False)
    decoder = decoder.to_empty(device=device).eval().requires_grad_(False)
    encoder = encoder.to_empty(device=device).eval().requires_grad_(False)
    return model, decoder, encoder


def load_qwen3tts(
    path_or_repo: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    attention_backend: str = "auto",
) -> LoadedQwen3TTS:
    """Model, codec, tokenizer and config. dtype None: bf16 on CUDA, else fp32. The codec is fp32, but for the
    decoder's convolutional part on CUDA with a 16-bit model (`DECODER_CONV_DTYPE`); on CUDA the model's projections
    are fused (`Qwen3TTSModel.fuse_projections`)."""
    directory = resolve_checkpoint(path_or_repo)
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = load_config(directory)
    model, decoder, encoder = build_modules(config, device, dtype, attention_backend)
    load_strict({"": model}, _read(directory / "model.safetensors"), str(directory / "model.safetensors"))
    codec_file = directory / "speech_tokenizer" / "model.safetensors"
    load_strict({"decoder.": decoder, "encoder.": encoder}, _read(codec_file), str(codec_file))
    if device.type == "cuda":
        model.fuse_projections()
        if dtype != torch.float32:
            decoder.set_conv_dtype(DECODER_CONV_DTYPE)
    return LoadedQwen3TTS(model, decoder, encoder, Qwen3TTSTokenizer.from_dir(directory), config, directory)
