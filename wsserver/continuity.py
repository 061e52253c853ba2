"""Voice continuity within a context: what each segment is conditioned on.

Segment 0 starts from the voice (zero-shot, or the voice's prompt audio as a continuation). On a model that can
continue from its own output (ModelInfo.continuation) every later segment continues the previous one: its text and the
latents the engine generated for it, so a turn streamed in pieces keeps one voice and one prosody. The carried audio is
capped to its last `carry_s` seconds (longer prompts cost prefill and add nothing); the carried text is cut in the same
proportion, at a word start, so the two still match.
On VoxCPM2 the voice's reference audio (or, for a prompt voice, its prompt audio) rides along as the isolated
reference, so the timbre stays anchored to the voice rather than drifting with each segment. The voice's preset
speaker, and the context's instruction and language, condition every segment alike.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from engine import GenerationParams, GenerationRequest, ModelInfo, Prompt
from wsserver.messages import GenerationSettings
from wsserver.voices import Voice


class Continuity:
    def __init__(
        self, voice: Voice, info: ModelInfo, carry_s: float, instruction: str = "", language: str = ""
    ) -> None:
        """`instruction` and `language` are already checked against `info` (wsserver.messages)."""
        self.voice = voice
        self.info = info
        self.instruction, self.language = instruction, language
        self.max_patches = max(1, math.ceil(carry_s * info.sample_rate / info.samples_per_patch))
        self._text = ""
        self._latents: np.ndarray | None = None  # [patches, patch_size, feat_dim] of the previous segment

    def prompt(self) -> Prompt:
        if self._latents is None:
            prompt = self.voice.prompt()
        else:
            reference = self.voice.reference_latents
            if reference is None and self.info.supports_reference:
                reference = self.voice.latents
            prompt = Prompt(
                text=self._text, latents=self._latents, reference_latents=reference, speaker=self.voice.speaker
            )
        return dataclasses.replace(prompt, instruction=self.instruction, language=self.language)

    def request(
        self, text: str, generation: GenerationSettings, segment: int, max_patches: int, lora: str | None = None
    ) -> GenerationRequest:
        """The engine request for segment `segment` of the context, which says `text` (with LoRA adapter `lora`)."""
        return GenerationRequest(
            text=text,
            prompt=self.prompt(),
            params=GenerationParams(
                cfg_value=generation.cfg_value,
                temperature=generation.temperature,
                inference_timesteps=generation.inference_timesteps,
                # Distinct but reproducible noise per segment of a seeded context.
                seed=None if generation.seed is None else (generation.seed + segment) % 2**63,
                max_patches=max_patches,
                lora=lora or None,
            ),
        )

    def record(self, text: str, latents: list[np.ndarray]) -> None:
        """Remember a finished segment (its latents, one [patch_size, feat_dim] array per chunk) for the next one.
        A model that cannot continue from its own output (not ModelInfo.continuation) starts each from the voice."""
        if not latents or not self.info.continuation:
            return
        kept = latents[-self.max_patches :]
        self._latents = np.stack(kept)
        self._text = tail_text(text, len(kept) / len(latents))


def tail_text(text: str, fraction: float) -> str:
    """Roughly the last `fraction` of `text` (the audio kept is the last part of the segment), from a word start
    when the text has spaces; text without spaces (CJK) is cut at a character."""
    if fraction >= 1:
        return text
    cut = len(text) - math.ceil(len(text) * fraction)
    space = max(text.rfind(" ", 0, cut + 1), text.rfind("\n", 0, cut + 1))
    return text[space + 1 :] if space >= 0 else text[cut:]
