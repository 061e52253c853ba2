"""ModelInfo values for the sans-I/O tests: what a runner of each family reports. ModelInfo is the engine's plain
contract with the server, so a test may state one instead of loading a model."""

from __future__ import annotations

from engine import ModelInfo

VOXCPM2 = ModelInfo("tiny", "voxcpm", "voxcpm2", 48000, 16000, 4, 16, 7680, ("prompt", "reference", "both"), True)
# Qwen3-TTS CustomVoice 1.7B: preset speakers and instructions, no cloning, no continuation of its own output.
QWEN3_CUSTOM = ModelInfo(
    "tiny-qwen",
    "qwen3tts",
    "qwen3tts-customvoice",
    24000,
    0,  # it encodes no audio
    1,
    16,
    1920,
    voice_roles=(),
    continuation=False,
    speakers=("aiden", "vivian"),
    instruction=True,
    languages=("auto", "chinese", "english"),
)
