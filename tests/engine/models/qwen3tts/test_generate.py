"""The frame loop: a request alone equals the same request inside a batch of rows with other lengths (greedy
and seeded sampling), frame caps, and bad settings refused."""

from __future__ import annotations

import pytest
import torch

from engine.models.qwen3tts import VoiceRequest, build_prompt
from engine.models.qwen3tts.generate import GenerationSettings, OfflineGenerator
from engine.models.qwen3tts.sampling import SamplingParams
from tests.engine.models.qwen3tts.conftest import GREEDY


def _prompt(model, text: str, speaker: str = "vivian", non_streaming: bool | None = None):
    request = VoiceRequest(text=text, language="english", speaker=speaker, non_streaming=non_streaming)
    return build_prompt(request, model.tokenizer, model.config)


@pytest.mark.parametrize("mode", ["greedy", "counter-noise", "reference-rng"])
def test_alone_equals_batched(loaded, mode: str) -> None:
    model = loaded("customvoice-1.7b")
    prompts = [
        _prompt(model, "Hello."),
        _prompt(model, "A much longer sentence, to give this row another prompt length.", "ryan"),
        _prompt(model, "Streaming text.", "aiden", non_streaming=False),
    ]
    caps = [4, 2, 6]  # rows leave the batch at different steps
    settings = [
        GenerationSettings(GREEDY.talker, GREEDY.predictor, max_frames=cap)
        if mode == "greedy"
        else GenerationSettings(max_frames=cap, seed=11 + i)
        for i, cap in enumerate(caps)
    ]
    generator = OfflineGenerator(model.model, reference_rng=mode == "reference-rng")
    batched = generator.generate(prompts, settings)
    for prompt, setting, codes in zip(prompts, settings, batched, strict=True):
        alone = generator.generate([prompt], [setting])[0]
        assert codes.shape == (setting.max_frames, 16)
        assert torch.equal(alone, codes)


def test_seed_reproduces_and_differs(loaded) -> None:
    model = loaded("customvoice-0.6b")
    prompt = _prompt(model, "Hello.")
    generator = OfflineGenerator(model.model)
    first, again, other = (
        generator.generate([prompt], [GenerationSettings(max_frames=4, seed=s)])[0] for s in (1, 1, 2)
    )
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GenerationSettings(max_frames=0), "max_frames"),
        (lambda: GenerationSettings(repetition_penalty=0.0), "repetition_penalty"),
        (lambda: SamplingParams(temperature=0.0), "temperature"),
        (lambda: SamplingParams(top_p=1.5), "top_p"),
        (lambda: SamplingParams(top_k=-1), "top_k"),
    ],
)
def test_bad_settings_are_refused(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()
