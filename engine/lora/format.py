"""The released VoxCPM LoRA layout, read strictly, and written (for tests, benchmarks and `make_adapter`).

A directory with:
- `lora_config.json`: {"base_model": str | null, "lora_config": {enable_lm, enable_dit, enable_proj, r, alpha,
  dropout, target_modules_lm, target_modules_dit, target_proj_modules}} (what voxcpm's training script saves:
  `LoRAConfig.model_dump()`).
- `lora_weights.safetensors`: `<module>.lora_A` [r, in] and `<module>.lora_B` [out, r] for every targeted linear,
  named as in the released model (`base_lm.layers.0.self_attn.q_proj.lora_A`, ...).

Which linears an adapter targets follows voxcpm's `_apply_lora`: enable_lm -> base_lm and residual_lm linears whose
attribute name is in target_modules_lm; enable_dit -> the LocDiT estimator's, by target_modules_dit; enable_proj ->
the model-level projections named in target_proj_modules. Dropout is a training knob and is ignored.

The model supplies the table of linears an adapter may target (`Target`, by released module path); everything
else is an error that names the tensor or the setting at fault.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.lora import CONFIG_FILE, WEIGHTS_FILE, AdapterError
from engine.models.voxcpm.state_dict import mismatches

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "Adapter", "AdapterError", "LoRAConfig", "Target", "read_adapter"]

GROUPS = ("lm", "dit", "proj")
ATTENTION = ("q_proj", "v_proj", "k_proj", "o_proj")  # voxcpm's default LM and DiT targets
PROJECTIONS = ("enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj", "fusion_concat_proj")  # VoxCPM2's defaults


@dataclass(frozen=True, slots=True)
class Target:
    """A linear an adapter may target: its released shape and the group whose settings select it."""

    in_features: int
    out_features: int
    group: str  # "lm" (base/residual LM), "dit" (LocDiT estimator), "proj" (model-level projections)

    @staticmethod
    def short_name(path: str) -> str:
        return path.rsplit(".", 1)[-1]


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    """voxcpm's LoRAConfig (same field names and defaults), as saved in lora_config.json."""

    enable_lm: bool = False
    enable_dit: bool = False
    enable_proj: bool = False
    r: int = 8
    alpha: float = 16
    dropout: float = 0.0
    target_modules_lm: tuple[str, ...] = ATTENTION
    target_modules_dit: tuple[str, ...] = ATTENTION
    target_proj_modules: tuple[str, ...] = PROJECTIONS

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def enabled(self, group: str) -> bool:
        return {"lm": self.enable_lm, "dit": self.enable_dit, "proj": self.enable_proj}[group]

    def names(self, group: str) -> tuple[str, ...]:
        return {"lm": self.target_modules_lm, "dit": self.target_modules_dit, "proj": self.target_proj_modules}[group]

    def selects(self, path: str, target: Target) -> bool:
        return self.enabled(target.group) and Target.short_name(path) in self.names(target.group)

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: object, source: str) -> LoRAConfig:
        if not isinstance(data, dict):
            raise AdapterError(f"{source}: 'lora_config' must be an object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise AdapterError(f"{source}: unknown lora_config settings: {', '.join(unknown)}")
        values = dict(data)
        for flag in ("enable_lm", "enable_dit", "enable_proj"):
            if not isinstance(values.get(flag, False), bool):
                raise AdapterError(f"{source}: {flag} must be true or false")
        defaults = cls()
        r = values.get("r", defaults.r)
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise AdapterError(f"{source}: rank r must be a positive integer, got {r!r}")
        alpha = values.get("alpha", defaults.alpha)
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha) or alpha <= 0:
            raise AdapterError(f"{source}: alpha must be a positive number, got {alpha!r}")
        for key in ("target_modules_lm", "target_modules_dit", "target_proj_modules"):
            names = values.get(key, getattr(defaults, key))
            if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
                raise AdapterError(f"{source}: {key} must be a list of module names")
            values[key] = tuple(names)
        return cls(**values)


@dataclass(slots=True)
class Adapter:
    """A validated adapter: per targeted module path, (A [r, in], B [out, r]) in float32 on the CPU."""

    config: LoRAConfig
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    base_model: str | None = None

    @property
    def rank(self) -> int:
        return self.config.r

    def short_names(self) -> set[str]:
        return {Target.short_name(path) for path in self.weights}


def selected_targets(config: LoRAConfig, targets: Mapping[str, Target], source: str) -> dict[str, Target]:
    """The linears `config` targets; a target name no linear of an enabled group has is an error."""
    for group in GROUPS:
        if not config.enabled(group):
            continue
        available = {Target.short_name(p) for p, t in targets.items() if t.group == group}
        unknown = sorted(set(config.names(group)) - available)
        if unknown:
            key = {"lm": "target_modules_lm", "dit": "target_modules_dit", "proj": "target_proj_modules"}[group]
            raise AdapterError(
                f"{source}: unknown target module(s) in {key}: {', '.join(unknown)} "
                f"(this model has: {', '.join(sorted(available))})"
            )
    return {path: target for path, target in targets.items() if config.selects(path, target)}


def read_adapter(directory: str | Path, targets: Mapping[str, Target], max_rank: int) -> Adapter:
    """Read and check an adapter directory against the model's targetable linears and the engine's max rank."""
    directory = Path(directory)
    config_file, weights_file = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for file in (config_file, weights_file):
        if not file.is_file():
            raise AdapterError(f"{directory}: missing {file.name} (an adapter is {CONFIG_FILE} + {WEIGHTS_FILE})")
    try:
        meta = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{config_file}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict) or "lora_config" not in meta:
        raise AdapterError(f"{config_file}: expected an object with a 'lora_config' entry")
    config = LoRAConfig.from_json(meta["lora_config"], str(config_file))
    if config.r > max_rank:
        raise AdapterError(f"{config_file}: rank r = {config.r} exceeds this engine's max LoRA rank {max_rank}")
    selected = selected_targets(config, targets, str(config_file))
    if not selected:
        raise AdapterError(f"{config_file}: targets no module (enable_lm, enable_dit and enable_proj select nothing)")

    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(weights_file), framework="pt")
        names = list(handle.keys())
        found = {name: tuple(handle.get_slice(name).get_shape()) for name in names}
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterError(f"{weights_file}: not a readable safetensors file ({exc})") from exc
    expected: dict[str, tuple[int, ...]] = {}
    for path, target in selected.items():
        expected[f"{path}.lora_A"] = (config.r, target.in_features)
        expected[f"{path}.lora_B"] = (target.out_features, config.r)
    problems = mismatches(found, expected)
    if problems:
        raise AdapterError(f"{weights_file} does not match lora_config.json (r = {config.r}) and the model: {problems}")
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for path in selected:
        a, b = (handle.get_tensor(f"{path}.lora_{part}").float() for part in "AB")
        for part, tensor in (("A", a), ("B", b)):
            if not torch.isfinite(tensor).all():
                raise AdapterError(f"{weights_file}: {path}.lora_{part} holds non-finite values")
        weights[path] = (a, b)
    base_model = meta.get("base_model")
    return Adapter(config, weights, base_model if isinstance(base_model, str) else None)


def write_adapter(directory: str | Path, adapter: Adapter) -> Path:
    """Write `adapter` in the released layout (the weights in float32)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path, (a, b) in adapter.weights.items():
        tensors[f"{path}.lora_A"] = a.contiguous()
        tensors[f"{path}.lora_B"] = b.contiguous()
    save_file(tensors, str(directory / WEIGHTS_FILE))
    meta = {"base_model": adapter.base_model, "lora_config": adapter.config.to_json()}
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return directory
