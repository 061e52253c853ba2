"""Write a random Qwen3-TTS 12 Hz checkpoint in the released layout (tests, demos, benchmarks).

    python -m engine.models.qwen3tts.make_checkpoint \
        --variant {customvoice-0.6b,customvoice-1.7b,base-0.6b,base-1.7b,voicedesign-1.7b} \
        --size {tiny,full} --out DIR [--seed N]

Files as in the Hugging Face repos: config.json, generation_config.json, preprocessor_config.json,
configuration.json, vocab.json + merges.txt + tokenizer_config.json, model.safetensors (bf16 for full, fp32 for
tiny), speech_tokenizer/{config.json, preprocessor_config.json, configuration.json, model.safetensors (fp32)}.
The configs carry the released special ids, languages, speakers and rates; `full` has the released widths and
depths, `tiny` shrinks widths and depths only (1.7B tiny keeps a talker wider than its predictor, so
`small_to_mtp_projection` exists). The text tokenizer is a small synthetic byte-level BPE with the released
special tokens (ids recorded in config.json) and whole-word tokens for the chat template's role names, so the
reference's positional slicing of the template holds.

Tensor names and shapes come from our own modules built on the meta device, so generator and loader cannot
disagree; the parity tests load the result in the reference package. Init: linear and conv weights
N(0, 1/fan_in), embeddings and codebooks N(0, 1), norms 1, biases 0, layer scales and ConvNeXt gains 0.1,
Snake parameters 0 (their log-scale identity).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.models.qwen3tts.config import parse_config

VARIANTS = ("customvoice-0.6b", "customvoice-1.7b", "base-0.6b", "base-1.7b", "voicedesign-1.7b")
SIZES = ("tiny", "full")

CODEC_SPECIAL = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
}  # fmt: skip
DIALECTS = {"beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKERS = {
    "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
    "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878,
}  # fmt: skip
SPEAKER_DIALECT = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
GENERATION = {
    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0, "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}  # fmt: skip
# The released tokenizer's added tokens, in id order (151643.. there; right after the base vocabulary here).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)  # fmt: skip
NOT_SPECIAL = {
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
}  # fmt: skip
WHOLE_WORDS = ("assistant", "user", "system")

# (talker hidden, talker ffn, talker layers, heads, kv heads, head dim, text hidden, predictor hidden/ffn/layers)
_TALKER = {
    ("full", "0b6"): (1024, 3072, 28, 16, 8, 128, 2048, 1024, 3072, 5),
    ("full", "1b7"): (2048, 6144, 28, 16, 8, 128, 2048, 1024, 3072, 5),
    ("tiny", "0b6"): (64, 128, 2, 4, 2, 16, 64, 64, 128, 2),
    ("tiny", "1b7"): (96, 192, 2, 4, 2, 16, 64, 64, 128, 2),
}
_SPEAKER_TINY = {"enc_channels": [16, 16, 16, 16, 48], "enc_attention_channels": 8, "enc_se_channels": 8}
_DECODER_TINY = {
    "hidden_size": 32, "intermediate_size": 64, "latent_dim": 32, "codebook_dim": 16, "decoder_dim": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
}  # fmt: skip
_ENCODER_TINY = {
    "hidden_size": 32, "num_filters": 4, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 64, "codebook_dim": 16, "vector_quantization_hidden_dimension": 16,
    "upsample_groups": 32,
}  # fmt: skip


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what byte-level BPE vocabularies are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def tokenizer_files(out: Path) -> dict[str, int]:
    """vocab.json, merges.txt, tokenizer_config.json; returns the special ids and the padded vocabulary size."""
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    merges = []
    for word in WHOLE_WORDS:
        piece = word[0]
        for ch in word[1:]:
            merges.append(f"{piece} {ch}")
            piece += ch
            vocab.setdefault(piece, len(vocab))
    ids = {token: len(vocab) + i for i, token in enumerate(SPECIAL_TOKENS)}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": t not in NOT_SPECIAL}
        for t, i in ids.items()
    }  # fmt: skip
    config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS[1:] if t not in NOT_SPECIAL],
        "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return {**ids, "assistant": vocab["assistant"], "vocab_end": len(vocab) + len(SPECIAL_TOKENS)}


def model_config(variant: str, size: str, tokens: dict[str, int]) -> dict[str, Any]:
    kind, params = variant.split("-")
    model_type = {"customvoice": "custom_voice", "base": "base", "voicedesign": "voice_design"}[kind]
    model_size = {"0.6b": "0b6", "1.7b": "1b7"}[params]
    hidden, ffn, layers, heads, kv, head_dim, text_hidden, p_hidden, p_ffn, p_layers = _TALKER[(size, model_size)]
    text_vocab = 151936 if size == "full" else math.ceil(tokens["vocab_end"] / 64) * 64
    predictor = {
        "model_type": "qwen3_tts_talker_code_predictor", "attention_bias": False, "attention_dropout": 0,
        "head_dim": head_dim, "hidden_act": "silu", "hidden_size": p_hidden, "intermediate_size": p_ffn,
        "layer_types": ["full_attention"] * p_layers, "max_position_embeddings": 65536, "max_window_layers": 28,
        "num_attention_heads": heads, "num_code_groups": 16, "num_hidden_layers": p_layers,
        "num_key_value_heads": kv, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "use_cache": True, "use_sliding_window": False, "vocab_size": 2048,
    }  # fmt: skip
    custom = model_type == "custom_voice"
    half = head_dim // 2
    section = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]  # [24, 20, 20] at head_dim 128
    talker = {
        "model_type": "qwen3_tts_talker", "attention_bias": False, "attention_dropout": 0,
        "code_predictor_config": predictor, **CODEC_SPECIAL,
        "codec_language_id": {**LANGUAGES, **(DIALECTS if custom else {})},
        "spk_id": dict(SPEAKERS) if custom else {},
        "spk_is_dialect": {s: SPEAKER_DIALECT.get(s, False) for s in SPEAKERS} if custom else {},
        "head_dim": head_dim, "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02,
        "intermediate_size": ffn, "max_position_embeddings": 32768, "num_attention_heads": heads,
        "num_code_groups": 16, "num_hidden_layers": layers, "num_key_value_heads": kv,
        "position_id_per_seconds": 13, "rms_norm_eps": 1e-06,
        "rope_scaling": {"interleaved": True, "mrope_section": section, "rope_type": "default", "type": "default"},
        "rope_theta": 1000000, "sliding_window": None, "text_hidden_size": text_hidden,
        "text_vocab_size": text_vocab, "use_cache": True, "use_sliding_window": False, "vocab_size": 3072,
    }  # fmt: skip
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "assistant_token_id": tokens["assistant"],
        "im_start_token_id": tokens["<|im_start|>"], "im_end_token_id": tokens["<|im_end|>"],
        "tts_pad_token_id": tokens["<tts_pad>"], "tts_bos_token_id": tokens["<tts_text_bos>"],
        "tts_eos_token_id": tokens["<tts_text_eod>"], "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": model_size, "tts_model_type": model_type,
        "talker_config": talker, "transformers_version": "4.57.3",
    }  # fmt: skip
    if model_type == "base":
        config["speaker_encoder_config"] = {"enc_dim": hidden, "sample_rate": 24000}
        if size == "tiny":
            config["speaker_encoder_config"].update(_SPEAKER_TINY)
    return config


def codec_config(size: str) -> dict[str, Any]:
    decoder = {
        "attention_bias": False, "attention_dropout": 0.0, "latent_dim": 1024, "codebook_dim": 512,
        "codebook_size": 2048, "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512,
        "intermediate_size": 1024, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
        "head_dim": 64, "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16,
        "num_quantizers": 16, "num_semantic_quantizers": 1, "rms_norm_eps": 1e-05, "rope_theta": 10000,
        "semantic_codebook_size": 4096, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 512,
    }  # fmt: skip
    encoder = {
        "_frame_rate": 12.5, "attention_bias": False, "attention_dropout": 0.0, "audio_channels": 1,
        "codebook_dim": 256, "codebook_size": 2048, "compress": 2, "dilation_growth_rate": 2, "dtype": "float32",
        "head_dim": 64, "hidden_act": "gelu", "hidden_size": 512, "initializer_range": 0.02,
        "intermediate_size": 2048, "kernel_size": 7, "last_kernel_size": 3, "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000, "norm_eps": 1e-05, "normalize": False, "num_attention_heads": 8,
        "num_filters": 64, "num_hidden_layers": 8, "num_key_value_heads": 8, "num_quantizers": 32,
        "num_residual_layers": 1, "num_semantic_quantizers": 1, "pad_mode": "constant",
        "residual_kernel_size": 3, "rope_theta": 10000.0, "sampling_rate": 24000, "sliding_window": 250,
        "trim_right_ratio": 1.0, "upsample_groups": 512, "upsampling_ratios": [8, 6, 5, 4], "use_cache": False,
        "use_causal_conv": True, "use_conv_shortcut": False, "use_streaming": False,
        "vector_quantization_hidden_dimension": 256,
    }  # fmt: skip
    if size == "tiny":
        decoder.update(_DECODER_TINY)
        encoder.update(_ENCODER_TINY)
        decoder["vector_quantization_hidden_dimension"] = decoder["codebook_dim"]
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
        "decode_upsample_rate": 1920, "encode_downsample_rate": 1920, "decoder_config": decoder,
        "encoder_config": encoder, "transformers_version": "4.57.3",
    }  # fmt: skip


def _init(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("bias", "beta", "alpha") or name.endswith("norm.bias"):
        return torch.zeros(shape)
    if leaf in ("cluster_usage", "initialized") or "norm" in name.rsplit(".", 2)[-2] or len(shape) == 1:
        return torch.ones(shape)
    if leaf in ("scale", "gamma"):
        return torch.full(shape, 0.1)
    if leaf in ("embedding_sum", "embed_sum") or "embedding" in name:
        return torch.randn(shape, generator=gen)
    fan_in = math.prod(shape[1:])
    return torch.randn(shape, generator=gen) / math.sqrt(fan_in)


def _random_tensors(
    shapes: dict[str, torch.Size], seed: int, dtype: torch.dtype, gains: dict[str, float] | None = None
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    gains = gains or {}
    return {
        name: (_init(name, shape, gen) * gains.get(name, 1.0)).to(dtype).contiguous()
        for name, shape in sorted(shapes.items())
    }


def make_checkpoint(variant: str, size: str, out: Path, seed: int = 0) -> Path:
    from engine.models.qwen3tts.checkpoint import build_modules, shapes

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} ({', '.join(VARIANTS)})")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} ({', '.join(SIZES)})")
    out.mkdir(parents=True, exist_ok=True)
    (out / "speech_tokenizer").mkdir(exist_ok=True)
    tokens = tokenizer_files(out)
    config = model_config(variant, size, tokens)
    codec = codec_config(size)
    files: dict[str, Any] = {
        "config.json": config,
        "generation_config.json": GENERATION,
        "preprocessor_config.json": {
            "padding_side": "left",
            "padding_value": 0.0,
            "processor_class": "Qwen3TTSProcessor",
            "return_attention_mask": True,
        },
        "configuration.json": {"framework": "Pytorch", "task": "text-to-speech"},
        "speech_tokenizer/config.json": codec,
        "speech_tokenizer/preprocessor_config.json": {
            "chunk_length_s": None,
            "feature_extractor_type": "EncodecFeatureExtractor",
            "feature_size": 1,
            "overlap": None,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": True,
            "sampling_rate": 24000,
        },
        "speech_tokenizer/configuration.json": {"framework": "pytorch", "task": "feature-extraction"},
    }
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    parsed = parse_config(config, codec, GENERATION)
    model, decoder, encoder = build_modules(parsed, "meta", torch.float32, "torch")
    dtype = torch.bfloat16 if size == "full" else torch.float32
    save_file(_random_tensors(shapes(model), seed, dtype), str(out / "model.safetensors"))
    codec_shapes = {**shapes(decoder, "decoder."), **shapes(encoder, "encoder.")}
    # The Snake stack grows activations (std ~8 before the output conv); a small output conv keeps the audio
    # mostly inside the final clamp to [-1, 1], so tests compare waveforms rather than clipped plateaus.
    out_conv = f"decoder.decoder.{len(decoder.decoder) - 1}.conv.weight"
    codec_tensors = _random_tensors(codec_shapes, seed + 1, torch.float32, {out_conv: 0.03})
    save_file(codec_tensors, str(out / "speech_tokenizer/model.safetensors"))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.models.qwen3tts.make_checkpoint", description=__doc__)
    parser.add_argument("--variant", required=True, choices=VARIANTS)
    parser.add_argument("--size", required=True, choices=SIZES)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(make_checkpoint(args.variant, args.size, args.out, args.seed))


if __name__ == "__main__":
    main()
