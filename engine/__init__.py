"""The VoxCPM streaming TTS engine. The public surface is exactly this module's `__all__` (docs/engine.md)."""

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.outputs import AudioChunk, EngineError, EngineStats, FinishReason, ModelInfo
from engine.params import GenerationParams, GenerationRequest, Prompt

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
