"""Write a random VoxCPM checkpoint in the released layout (for tests, the offline demo and benchmarks).

    python -m engine.models.voxcpm.make_checkpoint --variant {voxcpm-0.5b,voxcpm1.5,voxcpm2} \
        --size {tiny,full} --out DIR [--seed N] [--no-stop]

Files: config.json (with "architecture"; unset optional ints omitted, since the reference's pydantic models
reject null), model.safetensors (the released tensor names and shapes: bf16 for full, fp32 for tiny),
audiovae.pth ({"state_dict": ...}), and a synthetic Llama-style BPE tokenizer (tokenizer.json,
tokenizer_config.json, special_tokens_map.json) that the reference's LlamaTokenizerFast loads.

Tensor names and shapes come from our own model built on the meta device (released_shapes), so the generator
and the loader cannot disagree; the parity tests check them against the reference package. Init: linear
weights N(0, 1/fan_in), embeddings and the LocEnc CLS token N(0, 0.02), norms 1, biases 0. `--no-stop` makes the
stop head never fire (continue logit 0.01*sum(silu(4)) > stop logit), so every request runs to its cap.
Tensors are generated one at a time; a full VoxCPM2 peaks at ~4.8 GB RSS (its bf16 size) and takes ~2 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, normalizers
from tokenizers.models import BPE

from engine.models.voxcpm.audio_vae import random_state_dict
from engine.models.voxcpm.checkpoint import released_shapes
from engine.models.voxcpm.config import parse_config
from engine.models.voxcpm.model import VoxCPMModel

VARIANTS = ("voxcpm-0.5b", "voxcpm1.5", "voxcpm2")
VOCAB_SIZE = {"full": 73448, "tiny": 1024}

# Release dimensions (research brief §1.1). Tiny keeps the topology: GQA 16:2 in every stack, VoxCPM2's local
# stacks with heads * head_dim != hidden, the same patch sizes and VAE rates.
_LM = {
    "full": {
        "voxcpm-0.5b": (1024, 4096, 24, None),
        "voxcpm1.5": (1024, 4096, 24, None),
        "voxcpm2": (2048, 6144, 28, 128),
    },
    "tiny": {"voxcpm-0.5b": (128, 256, 2, None), "voxcpm1.5": (128, 256, 2, None), "voxcpm2": (128, 256, 2, 8)},
}  # hidden, ffn, layers, kv_channels
_LOCAL = {
    "full": {
        "voxcpm-0.5b": (1024, 4096, 4, None),
        "voxcpm1.5": (1024, 4096, 8, None),
        "voxcpm2": (1024, 4096, 12, 128),
    },
    "tiny": {"voxcpm-0.5b": (128, 256, 2, None), "voxcpm1.5": (128, 256, 2, None), "voxcpm2": (64, 128, 2, 8)},
}  # LocEnc/LocDiT hidden, ffn, layers, kv_channels
_TOP = {
    "voxcpm-0.5b": {"patch_size": 2, "residual_lm_num_layers": 6, "scalar_quantization_latent_dim": 256},
    "voxcpm1.5": {"patch_size": 4, "residual_lm_num_layers": 6, "scalar_quantization_latent_dim": 256},
    "voxcpm2": {"patch_size": 4, "residual_lm_num_layers": 8, "scalar_quantization_latent_dim": 512},
}
_VAE = {
    "voxcpm-0.5b": {
        "encoder_rates": [2, 5, 8, 8],
        "decoder_dim": 1536,
        "decoder_rates": [8, 8, 5, 2],
        "sample_rate": 16000,
    },
    "voxcpm1.5": {
        "encoder_rates": [2, 3, 6, 7, 7],
        "decoder_dim": 2048,
        "decoder_rates": [7, 7, 6, 3, 2],
        "sample_rate": 44100,
    },
    "voxcpm2": {
        "encoder_rates": [2, 5, 8, 8],
        "decoder_dim": 2048,
        "decoder_rates": [8, 6, 5, 2, 2, 2],
        "sample_rate": 16000,
        "out_sample_rate": 48000,
        "sr_bin_boundaries": [20000, 30000, 40000],
        "cond_type": "scale_bias",
        "cond_dim": 128,
        "cond_out_layer": False,
    },
}


def _without_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def make_config(variant: str, size: str) -> dict[str, Any]:
    """The config.json dict of a variant at a size."""
    if variant not in VARIANTS or size not in VOCAB_SIZE:
        raise ValueError(f"unknown variant/size {variant!r}/{size!r}")
    v2 = variant == "voxcpm2"
    tiny = size == "tiny"
    hidden, ffn, layers, kv_channels = _LM[size][variant]
    head_dim = kv_channels or hidden // 16
    # Synthetic but non-trivial LongRoPE factors (the real values are not public); only their count matters
    # for loading. max == original positions, so only short_factor is used, with amplitude 1.
    factors = [round(1.0 + 0.25 * i / head_dim, 6) for i in range(head_dim // 2)]
    lm = _without_none(
        {
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_size": hidden,
            "intermediate_size": ffn,
            "max_position_embeddings": 32768,
            "num_attention_heads": 16,
            "num_hidden_layers": layers,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "type": "longrope",
                "long_factor": factors,
                "short_factor": factors,
                "original_max_position_embeddings": 32768,
            },
            "vocab_size": VOCAB_SIZE[size],
            "use_mup": False,
            "scale_emb": 12,
            "dim_model_base": 256,
            "scale_depth": 1.4,
            "rope_theta": 10000.0,
            "kv_channels": kv_channels,
        }
    )
    local_hidden, local_ffn, local_layers, local_kv = _LOCAL[size][variant]
    local = _without_none(
        {
            "hidden_dim": local_hidden,
            "ffn_dim": local_ffn,
            "num_heads": 16,
            "num_layers": local_layers,
            "kv_channels": local_kv,
        }
    )
    cfm = {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm", "inference_cfg_rate": 1.0}
    dit = {**local, "cfm_config": cfm, **({"dit_mean_mode": False} if v2 else {})}
    feat_dim = 16 if tiny else 64
    vae = {"encoder_dim": 8 if tiny else 128, "latent_dim": feat_dim, "depthwise": True, "use_noise_block": False}
    vae |= _VAE[variant]
    if tiny:
        vae["decoder_dim"] = 64  # divisible by 2 ** len(decoder_rates) for every variant
        if v2:
            vae["cond_dim"] = 8
    top = dict(_TOP[variant])
    if tiny:
        top["residual_lm_num_layers"] = 2
        top["scalar_quantization_latent_dim"] = 32
    return {
        "architecture": "voxcpm2" if v2 else "voxcpm",
        "lm_config": lm,
        "patch_size": top["patch_size"],
        "feat_dim": feat_dim,
        "residual_lm_num_layers": top["residual_lm_num_layers"],
        **({"residual_lm_no_rope": True} if v2 else {}),
        "scalar_quantization_latent_dim": top["scalar_quantization_latent_dim"],
        "scalar_quantization_scale": 9,
        "encoder_config": local,
        "dit_config": dit,
        "audio_vae_config": vae,
        "max_length": 8192 if v2 else 4096,
        **({} if v2 else {"dit_mean_mode": False}),
        "device": "cuda",
        "dtype": "bfloat16",
    }


def random_weights(
    shapes: dict[str, torch.Size], seed: int, dtype: torch.dtype, no_stop: bool = False
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("embed_tokens.weight") or leaf == "special_token":
            tensor = torch.randn(shape, generator=gen) * 0.02
        elif leaf == "bias":
            tensor = torch.zeros(shape)
        elif len(shape) == 1:  # RMSNorm weights
            tensor = torch.ones(shape)
        else:
            tensor = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        out[name] = tensor.to(dtype)
    if no_stop:
        out["stop_proj.weight"].zero_()
        out["stop_proj.bias"].fill_(4.0)  # silu(4) ~ 3.93 in every channel
        out["stop_head.weight"][0].fill_(0.01)  # logit(continue) > logit(stop)
        out["stop_head.weight"][1].fill_(-0.01)
    return out


# A few CJK characters and words; the words become multi-character vocab entries that the wrapper splits.
_CJK_WORDS = ["你好", "世界", "今天", "天气", "我们", "语音", "合成", "中国", "朋友", "谢谢"]
_WORDS = ["hello", "world", "the", "and", "speech", "voice", "test", "stream", "model", "audio", "is", "to"]


def make_tokenizer(vocab_size: int) -> Tokenizer:
    """A Llama-style (SentencePiece BPE, byte fallback, "▁" word marker) tokenizer padded to vocab_size."""
    vocab: dict[str, int] = {}

    def add(token: str) -> None:
        if token not in vocab:
            vocab[token] = len(vocab)

    for special in ("<unk>", "<s>", "</s>"):
        add(special)
    for byte in range(256):
        add(f"<0x{byte:02X}>")
    add("▁")
    for code in range(33, 127):
        add(chr(code))
    for ch in sorted({c for w in _CJK_WORDS for c in w}):
        add(ch)
    merges: list[tuple[str, str]] = []
    for word in [f"▁{w}" for w in _WORDS] + _CJK_WORDS + [f"▁{w}" for w in _CJK_WORDS]:
        piece = word[0]
        for ch in word[1:]:
            if (piece, ch) not in merges:
                merges.append((piece, ch))
            piece += ch
            add(piece)
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for the synthetic tokenizer ({len(vocab)})")
    for i in range(vocab_size - len(vocab)):
        add(f"<|extra_{i}|>")
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tokenizer


def write_tokenizer(out: Path, vocab_size: int) -> None:
    make_tokenizer(vocab_size).save(str(out / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    tokenizer_config = {
        **specials,
        "add_bos_token": True,
        "add_eos_token": False,
        "tokenizer_class": "LlamaTokenizer",
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "legacy": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))


# The offline demo checkpoint that `python -m engine` and `python -m wsserver` fall back to without --model.
DEMO_CHECKPOINT = Path(__file__).resolve().parents[3] / ".cache" / "demo-voxcpm2-tiny"


def demo_checkpoint() -> Path:
    """The tiny random VoxCPM2 demo checkpoint, generated on first use (offline). It makes noise, not speech."""
    if not (DEMO_CHECKPOINT / "config.json").is_file():
        make_checkpoint("voxcpm2", "tiny", DEMO_CHECKPOINT)
    return DEMO_CHECKPOINT


def make_checkpoint(variant: str, size: str, out: str | Path, seed: int = 0, no_stop: bool = False) -> Path:
    """Write a checkpoint directory and return its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = make_config(variant, size)
    config = parse_config(raw)
    with torch.device("meta"):
        shapes = released_shapes(VoxCPMModel(config))
    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    weights = random_weights(shapes, seed, dtype, no_stop)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    del weights
    torch.save({"state_dict": random_state_dict(config.audio_vae_config, seed + 1)}, out / "audiovae.pth")
    write_tokenizer(out, raw["lm_config"]["vocab_size"])
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--size", choices=sorted(VOCAB_SIZE), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-stop", action="store_true", help="disable the stop head")
    args = parser.parse_args(argv)
    path = make_checkpoint(args.variant, args.size, args.out, args.seed, args.no_stop)
    print(f"wrote {args.variant} ({args.size}) to {path}")


if __name__ == "__main__":
    main()
