"""Parity with the reference (qwen-tts 0.1.1, CPU fp32) on tiny random checkpoints of every variant.

Codes must be identical frame by frame (greedy, and sampled with the reference's RNG stream); waveforms agree
within WAV_TOL (measured: at most 5.5e-5 of full scale; float summation order in the decoder's convs and
attention). The checkpoints are our generator's, so these tests also show that the reference loads its layout.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from engine.models.qwen3tts.generate import GenerationSettings, OfflineGenerator
from engine.models.qwen3tts.make_checkpoint import VARIANTS
from tests.engine.models.qwen3tts.conftest import FRAMES, GREEDY, REQUESTS, TOKENIZE, our_prompts, reference_audio

WAV_TOL = 2e-4


def _file_shapes(path) -> dict[str, tuple[int, ...]]:
    handle = safe_open(str(path), framework="pt")
    return {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}  # noqa: SIM118


@pytest.mark.parametrize("variant", VARIANTS)
def test_generator_layout_is_the_reference_modules(variant, qwen_checkpoint, reference) -> None:
    layout = reference[f"layout:{variant}"]
    directory = qwen_checkpoint(variant)
    assert _file_shapes(directory / "model.safetensors") == layout["model"]
    assert _file_shapes(directory / "speech_tokenizer" / "model.safetensors") == layout["codec"]


def test_tokenizer_matches_reference(loaded, reference) -> None:
    tokenizer = loaded("customvoice-0.6b").tokenizer
    for text, ids in zip(TOKENIZE, reference["tokenize"]["ids"], strict=True):
        assert tokenizer.encode(text) == ids


@pytest.mark.parametrize("name", list(REQUESTS))
def test_codes_and_audio_match_reference(name, loaded, reference) -> None:
    variant, _, _, extra = REQUESTS[name]
    model = loaded(variant)
    settings = GREEDY if extra.get("greedy", True) else GenerationSettings(max_frames=FRAMES, seed=extra["seed"])
    prompts = our_prompts(model, name)
    # sampled rows draw from the reference's RNG stream (seeded as its torch.manual_seed), so ids match too
    ours = OfflineGenerator(model.model, reference_rng=True).generate(prompts, [settings] * len(prompts))
    ref = reference[name]
    for i, (codes, ref_codes, ref_wav) in enumerate(zip(ours, ref["codes"], ref["wavs"], strict=True)):
        assert torch.equal(codes, ref_codes), f"row {i}: frames differ at {(codes != ref_codes).any(1).nonzero()}"
        state = model.codec_decoder.new_state(1)
        if prompts[i].ref_codes is not None:
            # the reference decodes reference + generated codes and cuts the reference's share of the samples
            model.codec_decoder(prompts[i].ref_codes[None], state)
        wav = model.codec_decoder(codes[None], state)[0]
        assert wav.shape == ref_wav.shape
        assert (wav - ref_wav).abs().max() < WAV_TOL


def test_clone_inputs_match_reference(loaded, reference) -> None:
    """Our codec encoder and speaker encoder give the reference's ICL codes and x-vector for the same clip."""
    for name in ("base-0.6b", "base-1.7b-non-streaming-text"):
        model = loaded(REQUESTS[name][0])
        audio = reference_audio()
        assert torch.equal(model.codec_encoder.encode(audio), reference[name]["ref_codes"][0])
        vector = model.model.speaker_encoder.embed(audio)
        torch.testing.assert_close(vector, reference[name]["speaker_vectors"][0], rtol=1e-5, atol=1e-5)


def test_codec_decoder_matches_reference(loaded, reference) -> None:
    decoder = loaded("customvoice-0.6b").codec_decoder
    for codes, ref_wav in zip(reference["decode"]["codes"], reference["decode"]["wavs"], strict=True):
        wav = decoder(codes[None])[0]
        assert wav.shape == ref_wav.shape
        assert (wav - ref_wav).abs().max() < WAV_TOL
