"""The voice registry: "default" (zero-shot: the model picks a voice) and prompt voices from `--voices-dir`.

A prompt voice is `NAME.wav` (any rate, mono or stereo, 8/16/32-bit PCM) with its transcript in `NAME.txt`. Each is
encoded once at startup with `engine.encode_audio`; segments then start from the cached latents, so reference
encoding never sits on a request's path.
"""

from __future__ import annotations

import logging
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import AsyncEngine
from wsserver.audio import Resampler

logger = logging.getLogger(__name__)

DEFAULT_VOICE = "default"


@dataclass(frozen=True, slots=True)
class Voice:
    name: str
    text: str = ""  # what the prompt audio says
    latents: np.ndarray | None = None  # [patches, patch_size, feat_dim]; None: zero-shot


class VoiceRegistry:
    def __init__(self, voices: list[Voice]) -> None:
        self._voices = {voice.name: voice for voice in voices}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._voices)

    def get(self, name: str) -> Voice:
        return self._voices[name]

    @classmethod
    async def load(cls, engine: AsyncEngine, voices_dir: Path | None) -> VoiceRegistry:
        voices = [Voice(DEFAULT_VOICE)]
        for wav_path in sorted(voices_dir.glob("*.wav")) if voices_dir is not None else []:
            text_path = wav_path.with_suffix(".txt")
            if wav_path.stem == DEFAULT_VOICE or not text_path.exists():
                logger.warning(
                    "skipping voice %s: needs a transcript %s and a name other than 'default'", wav_path, text_path.name
                )
                continue
            wav = read_wav(wav_path, engine.info.encoder_sample_rate)
            latents = await engine.encode_audio(wav, padding="left")
            voices.append(Voice(wav_path.stem, text_path.read_text(encoding="utf-8").strip(), latents))
            logger.info("voice %r: %.1f s of prompt audio", wav_path.stem, wav.size / engine.info.encoder_sample_rate)
        return cls(voices)


def read_wav(path: Path, rate: int) -> np.ndarray:
    """A PCM WAV file as float32 mono at `rate`."""
    with wave.open(str(path), "rb") as f:
        width, channels, source_rate = f.getsampwidth(), f.getnchannels(), f.getframerate()
        raw = f.readframes(f.getnframes())
    dtype = {1: np.uint8, 2: np.int16, 4: np.int32}[width]
    samples = np.frombuffer(raw, dtype).astype(np.float32)
    if width == 1:  # 8-bit WAV is unsigned
        samples -= 128
    samples = samples.reshape(-1, channels).mean(axis=1) / float(2 ** (8 * width - 1))
    resampler = Resampler(source_rate, rate)
    return np.concatenate([resampler.process(samples), resampler.flush()])
