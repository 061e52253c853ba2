"""config.json (+ speech_tokenizer/config.json, generation_config.json) of a Qwen3-TTS 12 Hz checkpoint.

Parsing follows the reference (qwen-tts 0.1.1 `configuration_qwen3_tts*.py`): unknown keys are ignored, and
keys the reference needs but has no usable default for are required here (an error names the key path). The
code defaults of the talker are a stale prototype (32 codebooks, other special ids), so every talker field the
model depends on is read from the file; the speaker encoder and codec defaults are the released values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VARIANTS = ("custom_voice", "base", "voice_design")
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920  # 12.5 Hz codec frames


class ConfigError(ValueError):
    """The checkpoint's config files do not describe a Qwen3-TTS 12 Hz model."""


class _Reader:
    """Typed access to one JSON object; errors name the key path."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{path or 'config'} must be an object, got {type(data).__name__}")
        self.data = data
        self.path = path

    def _where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise ConfigError(f"missing {self._where(key)}")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise ConfigError(f"{self._where(key)} must be {kind.__name__}, got {value!r}")
        return value

    def sub(self, key: str, default: Any = ...) -> _Reader:
        return _Reader(self.get(key, dict, default), self._where(key))


@dataclass(frozen=True, slots=True)
class DecoderStackConfig:
    """A Qwen3 decoder stack (the talker or the code predictor)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    num_code_groups: int

    @staticmethod
    def parse(r: _Reader) -> DecoderStackConfig:
        hidden = r.get("hidden_size", int)
        heads = r.get("num_attention_heads", int)
        if r.get("hidden_act", str, "silu") != "silu":
            raise ConfigError(f"{r.path}.hidden_act: only silu is supported")
        if r.get("attention_bias", bool, False):
            raise ConfigError(f"{r.path}.attention_bias: biased attention is not supported")
        return DecoderStackConfig(
            hidden_size=hidden,
            intermediate_size=r.get("intermediate_size", int),
            num_hidden_layers=r.get("num_hidden_layers", int),
            num_attention_heads=heads,
            num_key_value_heads=r.get("num_key_value_heads", int),
            head_dim=r.get("head_dim", int, hidden // heads),
            rms_norm_eps=r.get("rms_norm_eps", float, 1e-6),
            rope_theta=r.get("rope_theta", float, 10000.0),
            vocab_size=r.get("vocab_size", int),
            num_code_groups=r.get("num_code_groups", int),
        )


@dataclass(frozen=True, slots=True)
class TalkerConfig:
    stack: DecoderStackConfig
    predictor: DecoderStackConfig
    text_hidden_size: int
    text_vocab_size: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    language_ids: dict[str, int]  # lower-case name -> codec id (dialects included)
    speaker_ids: dict[str, int]  # lower-case name -> codec id (custom_voice only)
    speaker_dialect: dict[str, str | None]  # speaker -> dialect language it implies, or None


@dataclass(frozen=True, slots=True)
class SpeakerEncoderConfig:
    """ECAPA-TDNN (Base checkpoints); defaults are the reference's, which the released files rely on."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = SAMPLE_RATE

    @staticmethod
    def parse(r: _Reader) -> SpeakerEncoderConfig:
        d = SpeakerEncoderConfig()
        lists = {
            k: tuple(r.get(k, list, list(getattr(d, k)))) for k in ("enc_channels", "enc_kernel_sizes", "enc_dilations")
        }
        if len({len(v) for v in lists.values()}) != 1:
            raise ConfigError(f"{r.path}: enc_channels, enc_kernel_sizes and enc_dilations differ in length")
        return SpeakerEncoderConfig(
            mel_dim=r.get("mel_dim", int, d.mel_dim),
            enc_dim=r.get("enc_dim", int, d.enc_dim),
            enc_attention_channels=r.get("enc_attention_channels", int, d.enc_attention_channels),
            enc_res2net_scale=r.get("enc_res2net_scale", int, d.enc_res2net_scale),
            enc_se_channels=r.get("enc_se_channels", int, d.enc_se_channels),
            sample_rate=r.get("sample_rate", int, d.sample_rate),
            **lists,
        )


@dataclass(frozen=True, slots=True)
class CodecDecoderConfig:
    """The speech tokenizer's decoder (`Qwen3TTSTokenizerV2DecoderConfig`)."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 512
    intermediate_size: int = 1024
    latent_dim: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    @staticmethod
    def parse(r: _Reader) -> CodecDecoderConfig:
        d = CodecDecoderConfig()
        values: dict[str, Any] = {}
        for name in (
            "codebook_size",
            "codebook_dim",
            "hidden_size",
            "intermediate_size",
            "latent_dim",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "sliding_window",
            "num_quantizers",
            "decoder_dim",
        ):
            values[name] = r.get(name, int, getattr(d, name))
        for name in ("rms_norm_eps", "rope_theta", "layer_scale_initial_scale"):
            values[name] = r.get(name, float, getattr(d, name))
        for name in ("upsample_rates", "upsampling_ratios"):
            values[name] = tuple(r.get(name, list, list(getattr(d, name))))
        return CodecDecoderConfig(**values)

    @property
    def samples_per_frame(self) -> int:
        total = 1
        for rate in (*self.upsample_rates, *self.upsampling_ratios):
            total *= rate
        return total


@dataclass(frozen=True, slots=True)
class CodecEncoderConfig:
    """The speech tokenizer's encoder (transformers' `MimiConfig`, decoder parts unused)."""

    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 64
    intermediate_size: int = 2048
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 250
    layer_scale_initial_scale: float = 0.01
    codebook_size: int = 2048
    codebook_dim: int = 256
    vector_quantization_hidden_dimension: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    frame_rate: float = 12.5
    sampling_rate: int = SAMPLE_RATE

    @staticmethod
    def parse(r: _Reader) -> CodecEncoderConfig:
        d = CodecEncoderConfig()
        values: dict[str, Any] = {}
        for name in (
            "hidden_size",
            "num_filters",
            "num_residual_layers",
            "kernel_size",
            "last_kernel_size",
            "residual_kernel_size",
            "dilation_growth_rate",
            "compress",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "sliding_window",
            "codebook_size",
            "codebook_dim",
            "vector_quantization_hidden_dimension",
            "num_quantizers",
            "num_semantic_quantizers",
            "sampling_rate",
        ):
            values[name] = r.get(name, int, getattr(d, name))
        values["head_dim"] = r.get("head_dim", int, values["hidden_size"] // values["num_attention_heads"])
        for name in ("norm_eps", "rope_theta", "layer_scale_initial_scale"):
            values[name] = r.get(name, float, getattr(d, name))
        values["frame_rate"] = r.get("_frame_rate", float, d.frame_rate)
        values["upsampling_ratios"] = tuple(r.get("upsampling_ratios", list, list(d.upsampling_ratios)))
        for flag, want in (("use_causal_conv", True), ("normalize", False)):
            if r.get(flag, bool, want) != want:
                raise ConfigError(f"{r.path}.{flag}: only {want} is supported")
        if r.get("pad_mode", str, "constant") != "constant":
            raise ConfigError(f"{r.path}.pad_mode: only constant is supported")
        return CodecEncoderConfig(**values)


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """generation_config.json; absent keys take the wrapper's fallbacks (`_merge_generate_kwargs`)."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048

    @staticmethod
    def parse(r: _Reader) -> SamplingDefaults:
        d = SamplingDefaults()
        kinds = {bool: ("do_sample", "subtalker_dosample"), int: ("top_k", "subtalker_top_k", "max_new_tokens")}
        values: dict[str, Any] = {}
        for name in SamplingDefaults.__dataclass_fields__:
            kind = next((k for k, names in kinds.items() if name in names), float)
            values[name] = r.get(name, kind, getattr(d, name))
        return SamplingDefaults(**values)


@dataclass(frozen=True, slots=True)
class Qwen3TTSConfig:
    variant: str  # custom_voice | base | voice_design
    size: str  # 0b6 | 1b7 (the released names; 0b6 ignores instructions)
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None  # Base only
    codec_decoder: CodecDecoderConfig
    codec_encoder: CodecEncoderConfig
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673

    @property
    def languages(self) -> list[str]:
        """What a request may name (the reference's `get_supported_languages` plus "auto")."""
        return sorted([name for name in self.talker.language_ids if "dialect" not in name] + ["auto"])

    @property
    def speakers(self) -> list[str]:
        return sorted(self.talker.speaker_ids)

    @property
    def accepts_instruction(self) -> bool:
        """The 0.6B CustomVoice model drops instructions (the reference's wrapper does); Base has none."""
        return self.variant == "voice_design" or (self.variant == "custom_voice" and self.size != "0b6")


def _talker(r: _Reader) -> TalkerConfig:
    stack = DecoderStackConfig.parse(r)
    predictor = DecoderStackConfig.parse(r.sub("code_predictor_config"))
    rope = r.get("rope_scaling", dict, None)
    # The talker's interleaved M-RoPE gets three equal position streams, so it is plain 1-D RoPE; any section
    # split is then the same rotation. Only an unknown rope type would change the numbers.
    if rope is not None and rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"talker_config.rope_scaling: unsupported rope type {rope!r}")
    if stack.num_code_groups != predictor.num_code_groups:
        raise ConfigError("talker_config.num_code_groups differs from its code_predictor_config's")
    languages = r.get("codec_language_id", dict, {})
    speakers = r.get("spk_id", dict, {})
    dialects = r.get("spk_is_dialect", dict, {})
    for what, table in (("codec_language_id", languages), ("spk_id", speakers)):
        for key, value in table.items():
            if not isinstance(value, int) or not 0 <= value < stack.vocab_size:
                raise ConfigError(f"talker_config.{what}.{key} must be a codec id below {stack.vocab_size}")
    speaker_dialect: dict[str, str | None] = {}
    for name in speakers:
        dialect = dialects.get(name, False)
        if dialect is not False and dialect not in languages:
            raise ConfigError(f"talker_config.spk_is_dialect.{name}: {dialect!r} is not in codec_language_id")
        speaker_dialect[name.lower()] = None if dialect is False else dialect
    return TalkerConfig(
        stack=stack,
        predictor=predictor,
        text_hidden_size=r.get("text_hidden_size", int),
        text_vocab_size=r.get("text_vocab_size", int),
        codec_pad_id=r.get("codec_pad_id", int),
        codec_bos_id=r.get("codec_bos_id", int),
        codec_eos_id=r.get("codec_eos_token_id", int),
        codec_think_id=r.get("codec_think_id", int),
        codec_nothink_id=r.get("codec_nothink_id", int),
        codec_think_bos_id=r.get("codec_think_bos_id", int),
        codec_think_eos_id=r.get("codec_think_eos_id", int),
        language_ids={k.lower(): v for k, v in languages.items()},
        speaker_ids={k.lower(): v for k, v in speakers.items()},
        speaker_dialect=speaker_dialect,
    )


def parse_config(data: Any, codec: Any, generation: Any | None = None) -> Qwen3TTSConfig:
    r = _Reader(data, "")
    model_type = r.get("model_type", str)
    if model_type != "qwen3_tts":
        raise ConfigError(f"model_type {model_type!r} is not qwen3_tts")
    tokenizer_type = r.get("tokenizer_type", str, "qwen3_tts_tokenizer_12hz")
    if tokenizer_type != "qwen3_tts_tokenizer_12hz":
        raise ConfigError(f"tokenizer_type {tokenizer_type!r}: only the 12 Hz speech tokenizer is supported")
    variant = r.get("tts_model_type", str)
    if variant not in VARIANTS:
        raise ConfigError(f"tts_model_type {variant!r} is not one of {', '.join(VARIANTS)}")
    talker = _talker(r.sub("talker_config"))
    speaker_encoder = None
    if variant == "base":
        speaker_encoder = SpeakerEncoderConfig.parse(r.sub("speaker_encoder_config", {}))
        if speaker_encoder.enc_dim != talker.stack.hidden_size:
            raise ConfigError("speaker_encoder_config.enc_dim must equal talker_config.hidden_size")
    c = _Reader(codec, "speech_tokenizer")
    codec_type = c.get("model_type", str)
    if codec_type != "qwen3_tts_tokenizer_12hz":
        raise ConfigError(f"speech_tokenizer model_type {codec_type!r} is not qwen3_tts_tokenizer_12hz")
    decoder = CodecDecoderConfig.parse(c.sub("decoder_config"))
    rates = {
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": SAMPLES_PER_FRAME,
        "encode_downsample_rate": SAMPLES_PER_FRAME,
        "encoder_valid_num_quantizers": talker.stack.num_code_groups,
    }
    for name, want in rates.items():
        if c.get(name, int, want) != want:
            raise ConfigError(f"speech_tokenizer.{name} must be {want}")
    if decoder.samples_per_frame != SAMPLES_PER_FRAME or decoder.num_quantizers != talker.stack.num_code_groups:
        raise ConfigError("speech_tokenizer.decoder_config does not make 1920 samples from 16 codes per frame")
    if talker.predictor.vocab_size != decoder.codebook_size:
        raise ConfigError("code_predictor_config.vocab_size differs from the speech tokenizer's codebook_size")
    sampling = SamplingDefaults.parse(_Reader(generation, "generation_config")) if generation else SamplingDefaults()
    return Qwen3TTSConfig(
        variant=variant,
        size=r.get("tts_model_size", str, "0b6"),
        talker=talker,
        speaker_encoder=speaker_encoder,
        codec_decoder=decoder,
        codec_encoder=CodecEncoderConfig.parse(c.sub("encoder_config")),
        sampling=sampling,
        im_start_token_id=r.get("im_start_token_id", int, 151644),
        im_end_token_id=r.get("im_end_token_id", int, 151645),
        tts_pad_token_id=r.get("tts_pad_token_id", int, 151671),
        tts_bos_token_id=r.get("tts_bos_token_id", int, 151672),
        tts_eos_token_id=r.get("tts_eos_token_id", int, 151673),
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"missing {path}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc


def is_qwen3tts(directory: Path) -> bool:
    """Whether a checkpoint directory holds a Qwen3-TTS model (config.json's model_type)."""
    try:
        return json.loads((directory / "config.json").read_text(encoding="utf-8")).get("model_type") == "qwen3_tts"
    except (OSError, ValueError, AttributeError):
        return False


def load_config(directory: Path) -> Qwen3TTSConfig:
    generation = directory / "generation_config.json"
    return parse_config(
        _read_json(directory / "config.json"),
        _read_json(directory / "speech_tokenizer" / "config.json"),
        _read_json(generation) if generation.is_file() else None,
    )
