from __future__ import annotations

import dataclasses

import numpy as np

from tests.wsserver.models import QWEN3_CUSTOM
from tests.wsserver.models import VOXCPM2 as INFO
from wsserver import messages as m
from wsserver.continuity import Continuity, tail_text
from wsserver.voices import Voice, speaker_voices


def test_each_segment_continues_the_previous_one_capped() -> None:
    voice = Voice("alice", role="prompt", text="Alice here.", latents=np.ones((2, 4, 16), np.float32))
    continuity = Continuity(voice, INFO, carry_s=0.32)  # two patches of 160 ms
    first = continuity.prompt()
    assert first.text == "Alice here." and first.latents is voice.latents and first.reference_latents is None
    latents = [np.full((4, 16), i, np.float32) for i in range(4)]
    continuity.record("one two three four", latents)
    second = continuity.prompt()
    assert second.latents.shape == (2, 4, 16) and (second.latents[:, 0, 0] == [2, 3]).all()
    assert second.text == "three four" and second.reference_latents is voice.latents


def test_tail_text() -> None:
    assert tail_text("one two three four", 1.0) == "one two three four"
    assert tail_text("one two three four", 0.3) == "three four"  # the word the cut falls in is kept whole
    assert tail_text("one two three four", 0.2) == "four"
    assert tail_text("一二三四五六", 0.5) == "四五六"


def test_a_reference_voice_anchors_every_segment() -> None:
    reference = np.ones((3, 4, 16), np.float32)
    voice = Voice("vc_x", role="reference", reference_latents=reference)
    continuity = Continuity(voice, INFO, carry_s=0.32)
    first = continuity.prompt()
    assert first.latents is None and first.reference_latents is reference
    continuity.record("one two", [np.zeros((4, 16), np.float32)] * 2)
    second = continuity.prompt()
    assert second.text == "one two" and second.latents.shape == (2, 4, 16) and second.reference_latents is reference


def test_a_model_without_continuation_starts_every_segment_from_the_voice() -> None:
    info = dataclasses.replace(INFO, voice_roles=("reference",), continuation=False)
    voice = Voice("vc_x", role="reference", reference_latents=np.ones((3, 4, 16), np.float32))
    continuity = Continuity(voice, info, carry_s=0.32)
    continuity.record("one two", [np.zeros((4, 16), np.float32)] * 2)
    second = continuity.prompt()
    assert second.text == "" and second.latents is None and second.reference_latents is voice.reference_latents


def test_speaker_instruction_and_language_condition_every_segment() -> None:
    speaker = speaker_voices(QWEN3_CUSTOM)["vivian"]
    for info in (QWEN3_CUSTOM, dataclasses.replace(QWEN3_CUSTOM, continuation=True)):
        continuity = Continuity(speaker, info, carry_s=0.5, instruction="Cheerful.", language="english")
        first = continuity.request("one two", m.GenerationSettings(), 0, 100)
        continuity.record("one two", [np.zeros((1, 16), np.float32)] * 3)
        second = continuity.prompt()
        for prompt in (first.prompt, second):
            assert (prompt.speaker, prompt.instruction, prompt.language) == ("vivian", "Cheerful.", "english")
        assert first.prompt.latents is None
        # Only a family that continues from its own output gets the previous segment's codes.
        assert (second.latents is not None) == info.continuation
