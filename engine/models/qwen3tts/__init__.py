"""Qwen3-TTS 12 Hz (CustomVoice 0.6B/1.7B, Base 0.6B/1.7B, VoiceDesign 1.7B) for the engine.

- `load_qwen3tts(path_or_repo, device, dtype, attention_backend) -> LoadedQwen3TTS`
  (model, codec_decoder, codec_encoder, tokenizer, config, path)
- `build_prompt(VoiceRequest, tokenizer, config) -> Qwen3Prompt`; `Qwen3TTSModel.embed_prompt` turns it into rows
- `engine.models.qwen3tts.generate`: the batched frame loop over the paged talker (offline form)
- `CodecDecoder(codes, state)`: offline and streaming decode; `CodecEncoder.encode(audio)`: clone codes
- `engine.models.qwen3tts.make_checkpoint`: random checkpoints in the released layout (`python -m`)
"""

from engine.models.qwen3tts.checkpoint import LoadedQwen3TTS, load_qwen3tts
from engine.models.qwen3tts.config import ConfigError, Qwen3TTSConfig, is_qwen3tts, load_config
from engine.models.qwen3tts.prompt import ClonePrompt, PromptError, Qwen3Prompt, VoiceRequest, build_prompt

__all__ = [
    "ClonePrompt",
    "ConfigError",
    "LoadedQwen3TTS",
    "PromptError",
    "Qwen3Prompt",
    "Qwen3TTSConfig",
    "VoiceRequest",
    "build_prompt",
    "is_qwen3tts",
    "load_config",
    "load_qwen3tts",
]
