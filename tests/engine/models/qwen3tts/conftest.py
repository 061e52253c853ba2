"""Tiny random Qwen3-TTS checkpoints of every variant, their loaded forms, and one reference run per session.

The reference process (qwen-tts 0.1.1 on transformers 4.57) costs seconds to start, so every job the parity
tests compare against is declared here (`REQUESTS`) and run in one process the first time a test asks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.models.qwen3tts import ClonePrompt, LoadedQwen3TTS, VoiceRequest, build_prompt, load_qwen3tts
from engine.models.qwen3tts.generate import GenerationSettings
from engine.models.qwen3tts.make_checkpoint import VARIANTS, make_checkpoint
from engine.models.qwen3tts.sampling import SamplingParams
from tests.engine.models.qwen3tts.reference import run_reference

FRAMES = 8  # generated frames per request in the parity runs
GREEDY = GenerationSettings(SamplingParams(do_sample=False), SamplingParams(do_sample=False), max_frames=FRAMES)


def reference_audio() -> torch.Tensor:
    """1.25 s of quiet noise at 24 kHz: the voice-clone reference clip (16 codec frames, not a whole number)."""
    return torch.randn(30000, generator=torch.Generator().manual_seed(3)) * 0.1


# name -> (variant, reference generate kind, items, extra job keys). Items use the reference wrapper's names.
REQUESTS: dict[str, tuple[str, str, list[dict[str, Any]], dict[str, Any]]] = {
    # two rows of different prompt lengths; a dialect speaker turns "chinese" into its dialect; 0.6B drops instruct
    "customvoice-0.6b": (
        "customvoice-0.6b",
        "custom_voice",
        [
            {"text": "Hello world.", "speaker": "vivian", "language": "english"},
            {"text": "Hi there, how are you today?", "speaker": "eric", "language": "chinese", "instruct": "Fast."},
        ],
        {},
    ),
    "customvoice-1.7b-streaming-text": (
        "customvoice-1.7b",
        "custom_voice",
        [{"text": "Good morning.", "speaker": "ryan", "language": "auto", "instruct": "Speak happily."}],
        {"non_streaming": False},
    ),
    "customvoice-0.6b-sampled": (
        "customvoice-0.6b",
        "custom_voice",
        [{"text": "Hello world.", "speaker": "serena", "language": "english"}],
        {"greedy": False, "seed": 7},
    ),
    "voicedesign-1.7b": (
        "voicedesign-1.7b",
        "voice_design",
        [
            {"text": "Hello world.", "instruct": "A deep calm voice.", "language": "english"},
            {"text": "Welcome back, everyone.", "instruct": "Bright, young.", "language": "german"},
        ],
        {},
    ),
    # ICL (reference codes + transcript) next to x-vector only, streaming text (the wrapper's default for clones)
    "base-0.6b": (
        "base-0.6b",
        "voice_clone",
        [
            {"text": "Hello world.", "language": "english", "ref_text": "Hi there."},
            {"text": "Good morning to you.", "language": "auto", "x_vector_only": True},
        ],
        {},
    ),
    "base-1.7b-non-streaming-text": (
        "base-1.7b",
        "voice_clone",
        [{"text": "Hello world, again.", "language": "english", "ref_text": "Hi there, my friend."}],
        {"non_streaming": True},
    ),
}
TOKENIZE = ["Hello world. It's 12 o'clock!", "  spaces\n\nand\tTabs ", "Grüße, 你好, こんにちは — ok?"]


@pytest.fixture(scope="session")
def qwen_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    root = tmp_path_factory.mktemp("qwen3tts")
    made: dict[str, Path] = {}

    def make(variant: str) -> Path:
        if variant not in made:
            made[variant] = make_checkpoint(variant, "tiny", root / variant)
        return made[variant]

    return make


@pytest.fixture(scope="session")
def loaded(qwen_checkpoint: Callable[[str], Path]) -> Callable[[str], LoadedQwen3TTS]:
    cache: dict[str, LoadedQwen3TTS] = {}

    def load(variant: str) -> LoadedQwen3TTS:
        if variant not in cache:
            cache[variant] = load_qwen3tts(qwen_checkpoint(variant), attention_backend="torch")
        return cache[variant]

    return load


@pytest.fixture(scope="session")
def reference(qwen_checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every reference result the parity tests use, from one reference process."""
    audio = reference_audio().numpy()
    jobs: list[dict[str, Any]] = []
    names: list[str] = []
    for name, (variant, kind, items, extra) in REQUESTS.items():
        if kind == "voice_clone":
            items = [{**item, "ref_audio": audio} for item in items]
        jobs.append(
            {
                "op": "generate",
                "checkpoint": str(qwen_checkpoint(variant)),
                "kind": kind,
                "items": items,
                "max_new_tokens": FRAMES + 1,
                **extra,
            }
        )
        names.append(name)
    for variant in VARIANTS:
        jobs.append({"op": "layout", "checkpoint": str(qwen_checkpoint(variant))})
        names.append(f"layout:{variant}")
    cv = str(qwen_checkpoint("customvoice-0.6b"))
    jobs.append({"op": "tokenize", "checkpoint": cv, "texts": TOKENIZE})
    names.append("tokenize")
    codes = [torch.randint(0, 2048, (n, 16), generator=torch.Generator().manual_seed(n)) for n in (30, 11)]
    jobs.append({"op": "decode", "checkpoint": cv, "codes": codes})
    names.append("decode")
    results = run_reference(jobs, tmp_path_factory.mktemp("qwen3tts-reference"))
    out = dict(zip(names, results, strict=True))
    out["decode"]["codes"] = codes
    return out


def our_prompts(loaded_model: LoadedQwen3TTS, name: str):
    """Our prompts for a REQUESTS entry; voice clones use our codec encoder and speaker encoder."""
    _, kind, items, extra = REQUESTS[name]
    config = loaded_model.config
    prompts = []
    for item in items:
        clone = None
        if kind == "voice_clone":
            audio = reference_audio()
            vector = loaded_model.model.speaker_encoder.embed(audio)
            codes = None if item.get("x_vector_only") else loaded_model.codec_encoder.encode(audio)
            clone = ClonePrompt(vector, codes, item.get("ref_text"))
        request = VoiceRequest(
            text=item["text"],
            language=item.get("language", "auto"),
            speaker=item.get("speaker"),
            instruction=item.get("instruct"),
            clone=clone,
            non_streaming=extra.get("non_streaming"),
        )
        prompts.append(build_prompt(request, loaded_model.tokenizer, config))
    return prompts
