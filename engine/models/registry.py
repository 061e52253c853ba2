"""Which model family serves a checkpoint: read from its config.json, so that `--model` alone picks it.

Each family is one `Family` entry: how to recognise its config.json, and where its loader is
(`module:function`, imported only when chosen, taking `(config, directory, **kwargs)` and returning a ModelRunner).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.models.checkpoints import CheckpointError, resolve_checkpoint
from engine.models.family import ModelRunner


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    recognises: str  # what `matches` looks for, for error messages
    matches: Callable[[dict[str, Any]], bool]
    loader: str  # "module:function"

    def load(self, config: EngineConfig, directory: Path, **kwargs: Any) -> ModelRunner:
        module, function = self.loader.split(":")
        return getattr(importlib.import_module(module), function)(config, directory, **kwargs)


FAMILIES = (
    Family(
        "voxcpm",
        'architecture "voxcpm" or "voxcpm2"',
        lambda config: config.get("architecture") in ("voxcpm", "voxcpm2"),
        "engine.models.voxcpm.runner:load",
    ),
    Family(
        "qwen3tts",
        'model_type "qwen3_tts" (Qwen3-TTS 12 Hz)',
        lambda config: config.get("model_type") == "qwen3_tts",
        "engine.models.qwen3tts.runner:load",
    ),
)


def family_of(directory: Path) -> Family:
    """The family whose config.json `directory` holds (CheckpointError if none, or no readable config.json)."""
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    for family in FAMILIES:
        if family.matches(config):
            return family
    found = {key: config.get(key) for key in ("architecture", "model_type")}
    known = "; ".join(f"{family.name} ({family.recognises})" for family in FAMILIES)
    raise CheckpointError(f"{path} is of no model family this engine serves (found {found}); known: {known}")


def demo_checkpoint() -> Path:
    """The offline demo checkpoint served without --model: a tiny random VoxCPM2, generated on first use."""
    from engine.models.voxcpm.make_checkpoint import demo_checkpoint

    return demo_checkpoint()


def load_runner(config: EngineConfig, **kwargs: Any) -> ModelRunner:
    """The runner of `config.model` (a checkpoint directory or Hugging Face repo id); kwargs go to its loader."""
    directory = resolve_checkpoint(config.model)
    return family_of(directory).load(config, directory, **kwargs)
