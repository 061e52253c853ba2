"""config.json of a VoxCPM checkpoint as plain dataclasses (VoxCPM-0.5B / 1.5 = "voxcpm", VoxCPM2 = "voxcpm2").

Parsing follows the reference's pydantic models: unknown keys are ignored, missing required keys are an
error naming the key path, and defaults depend on the architecture (v1 and v2 models differ in them).
The AudioVAE section is parsed by the AudioVAE module's own `AudioVAEConfig`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.models.voxcpm.audio_vae import AudioVAEConfig

ARCHITECTURES = ("voxcpm", "voxcpm2")
# Token ids hard-coded in the reference models.
AUDIO_START_TOKEN = 101
AUDIO_END_TOKEN = 102
REF_AUDIO_START_TOKEN = 103
REF_AUDIO_END_TOKEN = 104


class ConfigError(ValueError):
    """config.json does not describe a VoxCPM model."""


@dataclass(frozen=True, slots=True)
class RopeScaling:
    type: str
    long_factor: list[float]
    short_factor: list[float]
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class MiniCPM4Config:
    """One MiniCPM4 decoder stack. The local modules and the residual LM are copies with overrides."""

    bos_token_id: int
    eos_token_id: int
    hidden_size: int
    intermediate_size: int
    max_position_embeddings: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    rms_norm_eps: float
    rope_scaling: RopeScaling
    vocab_size: int
    scale_emb: float
    dim_model_base: int
    scale_depth: float
    rope_theta: float
    use_mup: bool = True  # the reference's default; release configs set False
    kv_channels: int | None = None
    no_rope: bool = False

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels else self.hidden_size // self.num_attention_heads


@dataclass(frozen=True, slots=True)
class LocalStackConfig:
    """encoder_config (LocEnc) and the stack part of dit_config (LocDiT)."""

    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None


@dataclass(frozen=True, slots=True)
class CfmConfig:
    # Only the Euler solver exists for inference; the training-only fields are not kept.
    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "log-norm"
    inference_cfg_rate: float = 1.0


@dataclass(frozen=True, slots=True)
class DitConfig(LocalStackConfig):
    cfm_config: CfmConfig = field(kw_only=True)  # required, as in the reference
    dit_mean_mode: bool = False  # read from here for voxcpm2, from the top level for voxcpm (as the reference)


@dataclass(frozen=True, slots=True)
class VoxCPMConfig:
    architecture: str
    lm_config: MiniCPM4Config
    encoder_config: LocalStackConfig
    dit_config: DitConfig
    audio_vae_config: AudioVAEConfig
    patch_size: int
    feat_dim: int
    residual_lm_num_layers: int
    residual_lm_no_rope: bool
    scalar_quantization_latent_dim: int
    scalar_quantization_scale: int
    max_length: int
    dit_mean_mode: bool

    @property
    def is_v2(self) -> bool:
        return self.architecture == "voxcpm2"

    @property
    def mean_mode(self) -> bool:
        return self.dit_config.dit_mean_mode if self.is_v2 else self.dit_mean_mode

    def residual_lm(self) -> MiniCPM4Config:
        return dataclasses.replace(
            self.lm_config,
            num_hidden_layers=self.residual_lm_num_layers,
            vocab_size=0,
            # v1 has no such switch: its residual LM always uses RoPE.
            no_rope=self.residual_lm_no_rope if self.is_v2 else self.lm_config.no_rope,
        )

    def local_stack(self, stack: LocalStackConfig) -> MiniCPM4Config:
        """LocEnc/LocDiT stacks inherit everything else (kv heads, RoPE, eps) from lm_config."""
        return dataclasses.replace(
            self.lm_config,
            hidden_size=stack.hidden_dim,
            intermediate_size=stack.ffn_dim,
            num_attention_heads=stack.num_heads,
            num_hidden_layers=stack.num_layers,
            kv_channels=stack.kv_channels,
            vocab_size=0,
        )


# Top-level defaults that differ between the two reference config classes.
_TOP_DEFAULTS: dict[str, dict[str, Any]] = {
    "voxcpm": {
        "patch_size": 2,
        "feat_dim": 64,
        "residual_lm_num_layers": 6,
        "residual_lm_no_rope": False,
        "scalar_quantization_latent_dim": 256,
        "scalar_quantization_scale": 9,
        "max_length": 4096,
        "dit_mean_mode": False,
    },
    "voxcpm2": {
        "patch_size": 4,
        "feat_dim": 64,
        "residual_lm_num_layers": 8,
        "residual_lm_no_rope": False,
        "scalar_quantization_latent_dim": 512,
        "scalar_quantization_scale": 9,
        "max_length": 8192,
        "dit_mean_mode": False,
    },
}


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Check/convert one JSON value against a field annotation (the subset of types used here)."""
    if dataclasses.is_dataclass(annotation):
        return _parse(annotation, value, where)
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in typing.get_args(annotation):
            return None
        (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _coerce(value, inner, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (inner,) = typing.get_args(annotation)
        return [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected a boolean, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {annotation!r}")


def _parse(cls: type, data: Any, where: str, defaults: dict[str, Any] | None = None) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object, got {data!r}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = f"{where}.{f.name}" if where else f.name
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], key)
        elif defaults and f.name in defaults:
            kwargs[f.name] = defaults[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"config.json is missing the required key {key!r}")
    return cls(**kwargs)


def parse_config(data: dict[str, Any]) -> VoxCPMConfig:
    """Build a VoxCPMConfig from a parsed config.json. The reference treats a missing architecture as voxcpm."""
    architecture = str(data.get("architecture", "voxcpm")).lower()
    if architecture not in ARCHITECTURES:
        raise ConfigError(f"unsupported architecture {architecture!r} (expected one of {ARCHITECTURES})")
    body = {k: v for k, v in data.items() if k not in ("architecture", "audio_vae_config")}
    injected = {
        "architecture": architecture,
        "audio_vae_config": AudioVAEConfig.from_dict(
            data.get("audio_vae_config"), 2 if architecture == "voxcpm2" else 1
        ),
    }
    config = _parse(VoxCPMConfig, body, "", defaults=_TOP_DEFAULTS[architecture] | injected)
    _validate(config)
    return config


def _validate(config: VoxCPMConfig) -> None:
    lm = config.lm_config
    if lm.num_attention_heads % lm.num_key_value_heads:
        raise ConfigError("lm_config.num_attention_heads must be a multiple of num_key_value_heads")
    if config.audio_vae_config.latent_dim != config.feat_dim:
        raise ConfigError(
            f"audio_vae_config.latent_dim ({config.audio_vae_config.latent_dim}) != feat_dim ({config.feat_dim})"
        )
    # rope_scaling is shared by every stack, so all RoPE stacks must have one head_dim (true in the releases).
    head_dims = {lm.head_dim, config.local_stack(config.encoder_config).head_dim}
    head_dims.add(config.local_stack(config.dit_config).head_dim)
    if not lm.no_rope and len(head_dims) != 1:
        raise ConfigError(f"all MiniCPM4 stacks must share one head_dim for the shared RoPE factors, got {head_dims}")
    if len(lm.rope_scaling.short_factor) != lm.head_dim // 2 or len(lm.rope_scaling.long_factor) != lm.head_dim // 2:
        raise ConfigError(f"rope_scaling factors must have head_dim/2 = {lm.head_dim // 2} entries")
    if config.dit_config.cfm_config.solver != "euler":
        raise ConfigError(f"unsupported CFM solver {config.dit_config.cfm_config.solver!r}")


def load_config(path: str | Path) -> VoxCPMConfig:
    """Read config.json from a checkpoint directory (or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"no config.json at {path}") from exc
    return parse_config(data)
