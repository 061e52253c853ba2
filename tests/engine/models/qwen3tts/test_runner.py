"""Qwen3-TTS behind the engine core (engine/models/qwen3tts/runner.py): the engine's codes are the offline frame
loop's (which test_parity ties to the reference), a request alone equals it in a batch with requests that come and
go, cancel frees everything, voices clone, and bad requests are refused before queueing."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from engine.cuda_graphs import eager_token_ladder, eager_tokens
from engine.engine_core import EngineCore
from engine.models.qwen3tts import ClonePrompt, VoiceRequest, build_prompt
from engine.models.qwen3tts.generate import GenerationSettings, OfflineGenerator
from engine.models.qwen3tts.sampling import SamplingParams
from engine.outputs import AudioChunk, EngineError, FinishReason
from engine.params import GenerationParams, GenerationRequest, Prompt
from tests.engine.helpers import engine_config
from tests.engine.models.qwen3tts.conftest import reference_audio


def _request(rid: str, text: str, seed: int = 1, prompt: Prompt | None = None, **params) -> GenerationRequest:
    params.setdefault("min_patches", 0)  # the reference's own rule: EOS from the third frame on
    return GenerationRequest(text=text, prompt=prompt or Prompt(), params=GenerationParams(seed=seed, **params),
                             request_id=rid)  # fmt: skip


def _run(core: EngineCore) -> dict[str, list[AudioChunk]]:
    chunks: dict[str, list[AudioChunk]] = defaultdict(list)
    while core.has_work():
        for chunk in core.step():
            chunks[chunk.request_id].append(chunk)
    return chunks


def _codes(chunks: list[AudioChunk]) -> torch.Tensor:
    return torch.from_numpy(np.stack([c.latents[0] for c in chunks]).astype(np.int64))


def _offline(loaded, request: VoiceRequest, greedy: bool, frames: int, seed: int) -> torch.Tensor:
    prompt = build_prompt(request, loaded.tokenizer, loaded.config)
    if greedy:
        off = SamplingParams(do_sample=False)
        settings = GenerationSettings(off, off, max_frames=frames)
    else:
        settings = GenerationSettings(max_frames=frames, seed=seed)
    return OfflineGenerator(loaded.model).generate([prompt], [settings])[0]


@pytest.mark.parametrize("greedy", [True, False])
def test_engine_codes_are_the_offline_loops_and_batch_free(qwen_checkpoint, loaded, greedy: bool) -> None:
    variant = "customvoice-1.7b"
    temperature = 0.0 if greedy else 1.0
    config = engine_config(qwen_checkpoint(variant), max_patches=8)
    core = EngineCore(config)
    prompt = Prompt(speaker="ryan", language="english", instruction="Slowly.")
    core.add_request(_request("long", "A much longer sentence to say.", 3, prompt, temperature=temperature))
    first = core.step()  # "long" runs alone for a frame, then the others join
    core.add_request(_request("x", "Hello.", 7, Prompt(speaker="aiden"), temperature=temperature, max_patches=6))
    core.add_request(_request("short", "Hi.", 5, temperature=temperature, max_patches=2))
    chunks = _run(core)
    chunks["long"][:0] = first
    assert [len(chunks[r]) for r in ("long", "x", "short")] == [8, 6, 2]
    assert chunks["short"][-1].finish_reason is FinishReason.LENGTH

    model = loaded(variant)
    expected = {
        "long": (VoiceRequest("A much longer sentence to say.", "english", "ryan", "Slowly."), 3, 8),
        "x": (VoiceRequest("Hello.", speaker="aiden"), 7, 6),
        "short": (VoiceRequest("Hi.", speaker="vivian"), 5, 2),  # text alone: the default speaker
    }
    for rid, (request, seed, frames) in expected.items():
        assert torch.equal(_codes(chunks[rid]), _offline(model, request, greedy, frames, seed)), rid

    # the audio is the streaming decode of the request's own codes: no state crosses slots
    got = chunks["x"]
    wav = model.codec_decoder(_codes(got)[None])[0].numpy()
    np.testing.assert_allclose(np.concatenate([c.samples for c in got]), wav, atol=2e-4)
    assert all(c.samples.shape == (1920,) for c in got)


def test_eos_ends_a_request_with_its_last_real_frame(qwen_checkpoint, loaded) -> None:
    """The look-ahead reports STOP on the frame before EOS; the scheduler's min_patches is never overruled."""
    core = EngineCore(engine_config(qwen_checkpoint("customvoice-0.6b"), max_patches=12))
    model = core.runner.model
    eos = core.runner.config.talker.codec_eos_id
    with torch.no_grad():  # make EOS the argmax from the first frame it is allowed on
        model.talker.codec_head.weight[eos] = model.talker.codec_head.weight.abs().sum(0) * 10
    core.add_request(_request("a", "Hello.", temperature=0.0))
    core.add_request(_request("b", "Hello.", temperature=0.0, min_patches=4))
    chunks = _run(core)
    assert len(chunks["a"]) == 2 and chunks["a"][-1].finish_reason is FinishReason.STOP
    assert len(chunks["b"]) == 6 and chunks["b"][-1].finish_reason is FinishReason.STOP
    assert not any((c.latents == eos).any() for c in chunks["a"] + chunks["b"])


def test_the_engine_never_prefills_qwen3tts_prompts_ahead(qwen_checkpoint) -> None:
    """Its runner cannot (engine.models.family.PrefillsAhead): a burst's window waits for its arrivals as before."""
    core = EngineCore(engine_config(qwen_checkpoint("customvoice-0.6b"), prefill_ahead_tokens=1))
    assert core.prefill_ahead_tokens == 0


def test_cancel_frees_blocks_and_slots(qwen_checkpoint) -> None:
    core = EngineCore(engine_config(qwen_checkpoint("voicedesign-1.7b"), max_num_seqs=2))
    scheduler = core.scheduler
    free_blocks, free_slots = sorted(scheduler.block_manager.free_block_ids), sorted(scheduler.free_slots)
    for name in "abc":
        core.add_request(_request(name, "Hello there.", prompt=Prompt(instruction="A calm voice.")))
    core.step()  # a and b run, c waits
    assert core.abort("c") and core.abort("a") and core.abort("b")
    assert not core.abort("a")
    assert sorted(scheduler.block_manager.free_block_ids) == free_blocks
    assert sorted(scheduler.free_slots) == free_slots
    assert not core.has_work()


def test_voice_clone_through_the_engine(qwen_checkpoint, loaded) -> None:
    """Base: encode_audio's x-vector ("right") and codes ("left") make the ICL and x-vector-only prompts."""
    core = EngineCore(engine_config(qwen_checkpoint("base-0.6b"), max_patches=5))
    info = core.info
    assert info.family == "qwen3tts" and info.voice_roles == ("reference", "both")
    assert info.encoder_sample_rate == 24000 and info.audio_encoder_id.startswith("qwen3tts-base-")
    audio = reference_audio().numpy()
    xvec, codes = core.encode_audio(audio, "right"), core.encode_audio(audio, "left")
    assert codes.shape == (16, 1, 16)
    icl = Prompt(text="Hi there.", latents=codes, reference_latents=xvec)
    core.add_request(_request("icl", "Hello world.", 2, icl, temperature=0.0))
    core.add_request(_request("xvec", "Good morning.", 2, Prompt(reference_latents=xvec), temperature=0.0))
    chunks = _run(core)
    model = loaded("base-0.6b")
    vector = torch.from_numpy(xvec.reshape(-1))
    ref_codes = torch.from_numpy(codes[:, 0].astype(np.int64))
    for rid, clone, text in (
        ("icl", ClonePrompt(vector, ref_codes, "Hi there."), "Hello world."),
        ("xvec", ClonePrompt(vector), "Good morning."),
    ):
        assert torch.equal(_codes(chunks[rid]), _offline(model, VoiceRequest(text, clone=clone), True, 5, 0))


@pytest.mark.parametrize(
    ("variant", "prompt", "message"),
    [
        ("customvoice-0.6b", Prompt(speaker="bob"), "unknown speaker"),
        ("customvoice-0.6b", Prompt(instruction="Fast."), "takes no instruction"),
        ("customvoice-1.7b", Prompt(speaker="ryan", language="klingon"), "unsupported language"),
        ("voicedesign-1.7b", Prompt(reference_latents=np.zeros((4, 1, 16), np.float32)), "cannot clone"),
        ("base-0.6b", Prompt(latents=np.zeros((2, 1, 16), np.float32)), "needs the x-vector"),
        ("base-0.6b", Prompt(reference_latents=np.zeros((3, 1, 16), np.float32)), "not this model's x-vector"),
    ],
)
def test_bad_requests_are_refused_before_queueing(qwen_checkpoint, variant: str, prompt: Prompt, message: str) -> None:
    core = EngineCore(engine_config(qwen_checkpoint(variant)))
    with pytest.raises(EngineError, match=message):
        core.add_request(_request("bad", "Hello.", prompt=prompt))
    assert not core.has_work()


def test_encode_audio_refuses_what_it_cannot_encode(qwen_checkpoint) -> None:
    base = EngineCore(engine_config(qwen_checkpoint("base-0.6b")))
    with pytest.raises(EngineError, match="at least one 80 ms frame"):
        base.encode_audio(np.zeros(100, np.float32), "left")
    custom = EngineCore(engine_config(qwen_checkpoint("customvoice-0.6b")))
    with pytest.raises(EngineError, match="clones no voices"):
        custom.encode_audio(np.zeros(24000, np.float32), "left")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runner_on_cuda_bf16(qwen_checkpoint) -> None:
    """The engine on CUDA in bf16 (sdpa: the tiny head_dim of 16 is below flash-attn's): every request streams its
    frames, codes are codec ids, audio is finite and 1920 samples a frame."""
    config = engine_config(qwen_checkpoint("base-1.7b"), device="cuda", dtype="bfloat16", attention_backend="sdpa")
    core = EngineCore(config)
    audio = reference_audio().numpy()
    xvec, codes = core.encode_audio(audio, "right"), core.encode_audio(audio, "left")
    core.add_request(_request("a", "Hello there.", 1, Prompt(text="Hi.", latents=codes, reference_latents=xvec)))
    core.add_request(_request("b", "Good morning.", 2, max_patches=5))
    chunks = _run(core)
    assert 2 <= len(chunks["a"]) <= 12 and 2 <= len(chunks["b"]) <= 5  # EOS may come early: random weights
    for chunk in chunks["a"] + chunks["b"]:
        assert chunk.samples.shape == (1920,) and np.isfinite(chunk.samples).all()
        assert ((chunk.latents >= 0) & (chunk.latents < 2048)).all()


def test_lora_adapters_are_refused_at_start(qwen_checkpoint) -> None:
    with pytest.raises(ValueError, match="serves no LoRA adapters"):
        EngineCore(engine_config(qwen_checkpoint("customvoice-0.6b"), max_loras=2))
    assert EngineCore(engine_config(qwen_checkpoint("customvoice-0.6b"))).runner.lora is None


@pytest.mark.parametrize("option", ["fp8_gemms", "fp8_backbone"])
def test_fp8_gemms_are_refused(qwen_checkpoint, option: str) -> None:
    """FP8 GEMMs are a VoxCPM option: a Qwen3-TTS engine asked for them fails at start, not silently in bf16."""
    with pytest.raises(ValueError, match="fp8_backbone are for VoxCPM"):
        EngineCore(engine_config(qwen_checkpoint("base-0.6b"), **{option: True}))


def _record_prefill_positions(runner) -> list[int]:
    """The position count of every talker prefill that `runner` runs from now on, in order."""
    positions: list[int] = []
    body = runner._prefill_body

    def record(packed, x, tokens, *rest):
        positions.append(tokens)
        return body(packed, x, tokens, *rest)

    runner._prefill_body = record
    return positions


def _two_admissions(core: EngineCore) -> dict[str, list[AudioChunk]]:
    """Two requests admitted together, a third a frame later; greedy, so that the codes compare exactly."""
    core.add_request(_request("a", "Hello there.", 1, Prompt(speaker="ryan"), temperature=0.0, max_patches=4))
    core.add_request(_request("b", "A longer line to say.", 2, Prompt(speaker="aiden"), temperature=0.0, max_patches=4))
    chunks: dict[str, list[AudioChunk]] = defaultdict(list)
    for chunk in core.step():
        chunks[chunk.request_id].append(chunk)
    core.add_request(_request("c", "Late.", 3, Prompt(speaker="ryan"), temperature=0.0, max_patches=3))
    for request_id, more in _run(core).items():
        chunks[request_id] += more
    return chunks


def test_padded_eager_prefills_change_no_codes(qwen_checkpoint) -> None:
    """Eager admissions padded to the ladder (as on CUDA; forced here on the CPU, where every admission is eager)
    give the codes and audio of unpadded ones."""
    results = []
    for pad in (False, True):
        core = EngineCore(engine_config(qwen_checkpoint("customvoice-0.6b"), dtype="float64", max_num_seqs=4))
        core.runner.pad_eager_prefill = pad
        positions = _record_prefill_positions(core.runner)
        results.append(_two_admissions(core))
        assert len(positions) == 2
        if pad:
            assert all(eager_tokens(n) == n for n in positions)
        else:
            assert any(eager_tokens(n) != n for n in positions)  # so that padding them changes their shapes
    unpadded, padded = results
    assert unpadded.keys() == padded.keys() == {"a", "b", "c"}
    for key in unpadded:
        assert torch.equal(_codes(padded[key]), _codes(unpadded[key]))
        np.testing.assert_allclose(
            np.concatenate([c.samples for c in padded[key]]), np.concatenate([c.samples for c in unpadded[key]]),
            rtol=1e-10, atol=1e-10,
        )  # fmt: skip


def test_warm_up_runs_the_ladder_over_scratch_state_only(qwen_checkpoint) -> None:
    """Where eager prefills are padded, the warm-up runs the talker once at every size of the ladder up to the
    longest admission, and what the engine generates afterwards is what a fresh engine generates."""
    results = []
    for warm in (False, True):
        config = engine_config(
            qwen_checkpoint("customvoice-0.6b"), dtype="float64", max_num_seqs=4, max_model_len=60,
            max_prefill_tokens=40, idle_prefill_tokens=0,
        )  # fmt: skip
        core = EngineCore(config)
        core.runner.pad_eager_prefill = True
        if warm:
            positions = _record_prefill_positions(core.runner)
            core.runner.warm_up()
            assert positions == eager_token_ladder(60) == [16, 32, 48, 64]
        results.append(_two_admissions(core))
    cold, warmed = results
    for key in cold:
        assert torch.equal(_codes(warmed[key]), _codes(cold[key]))
        np.testing.assert_array_equal(
            np.concatenate([c.samples for c in warmed[key]]), np.concatenate([c.samples for c in cold[key]])
        )
