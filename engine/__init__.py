"""The streaming TTS engine (model families under engine/models/; VoxCPM today).

The public surface is exactly this module's `__all__` (docs/engine.md).

`AsyncEngine` (the engine on a thread of this process) is imported on first use: it brings torch and the model code,
which a process that only talks to an engine process (engine.client) never needs.
"""

from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.outputs import AudioChunk, EngineError, EngineStats, FinishReason, ModelInfo
from engine.params import GenerationParams, GenerationRequest, Prompt

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine

__all__ = [
    "AsyncEngine",
    "AudioChunk",
    "EngineConfig",
    "EngineError",
    "EngineStats",
    "FinishReason",
    "GenerationParams",
    "GenerationRequest",
    "ModelInfo",
    "Prompt",
]


def __getattr__(name: str) -> Any:
    if name == "AsyncEngine":
        from engine.async_engine import AsyncEngine

        return AsyncEngine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
