"""Qwen3-TTS checkpoints behind the real server: /info, speech over HTTP, a WebSocket segment, a Base voice cloned by
upload (x-vector alone: role reference; ICL: role both) used on both transports, and CustomVoice / VoiceDesign
conditioning (preset speakers as voices, instruction, language) on both transports, refused where the model lacks it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.models.qwen3tts.make_checkpoint import make_checkpoint
from tests.e2e.client import Client
from tests.e2e.test_voices_api import upload
from tests.servers import running_server


def _engine(tmp_path_factory: pytest.TempPathFactory, variant: str) -> Iterator[Any]:
    from engine import AsyncEngine, EngineConfig

    checkpoint = make_checkpoint(variant, "tiny", tmp_path_factory.mktemp("qwen3tts") / variant)
    config = EngineConfig(model=str(checkpoint), device="cpu", max_num_seqs=4, max_patches=8, kv_block_size=16,
                          max_model_len=256, coalesce_ms=1)  # fmt: skip
    engine = AsyncEngine(config)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    yield engine
    loop.run_until_complete(engine.close())
    loop.close()


@pytest.fixture(scope="module")
def qwen_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from _engine(tmp_path_factory, "base-0.6b")


@pytest.fixture(scope="module")
def instructed_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """CustomVoice 1.7B: preset speakers and instructions."""
    yield from _engine(tmp_path_factory, "customvoice-1.7b")


@pytest.fixture(scope="module")
def custom_voice_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """CustomVoice 0.6B: preset speakers, no instruction."""
    yield from _engine(tmp_path_factory, "customvoice-0.6b")


@pytest.fixture(scope="module")
def voice_design_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """VoiceDesign 1.7B: the instruction is the voice; no speakers."""
    yield from _engine(tmp_path_factory, "voicedesign-1.7b")


async def spoken(ws: Client, ctx: str, text: str = "Hello there. ", **settings: Any) -> bytes:
    """The PCM of a context created with `settings` and ended at once; it must end with context.done."""
    await ws.send("context.create", ctx=ctx, text=text, **settings)
    await ws.send("context.end", ctx=ctx)
    done = await ws.until_ended(ctx)
    assert done["type"] == "context.done", done
    [created] = ws.messages("context.created", ctx)
    return b"".join(frame.payload for frame in ws.frames(created["handle"]))


async def test_qwen3tts_serves_speech_websocket_and_cloned_voices(qwen_engine, tmp_path) -> None:
    async with (
        running_server(qwen_engine, tmp_path / "voices", max_patches=3) as running,
        httpx.AsyncClient(base_url=running.http_url, timeout=60) as http,
    ):
        model = (await http.get("/info")).json()["model"]
        assert model["family"] == "qwen3tts" and model["architecture"] == "qwen3tts-base"
        assert model["sample_rate"] == 24000 and "english" in model["languages"]

        speech = await http.post(
            "/v1/audio/speech", json={"input": "Hello.", "voice": "alloy", "response_format": "pcm"}
        )
        assert speech.status_code == 200 and len(speech.content) == 3 * 1920 * 2  # 3 frames of 24 kHz s16le

        voices = {}
        for role, transcript in (("reference", ""), ("both", "This is Alice speaking.")):
            created = await upload(http, role=role, transcript=transcript)
            assert created.status_code == 201, created.text
            voices[role] = created.json()["id"]
        refused = await upload(http, role="prompt")
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "unsupported"

        ws = await Client.connect(running.ws_url)
        for ctx, voice in (("a", "default"), ("b", voices["reference"]), ("c", voices["both"])):
            await ws.send("context.create", ctx=ctx, voice=voice, text="Hello there. ")
            await ws.send("context.end", ctx=ctx)
            assert (await ws.until_ended(ctx))["type"] == "context.done"
        await ws.close()
        cloned = await http.post(
            "/v1/audio/speech", json={"input": "Hi.", "voice": voices["both"], "response_format": "wav"}
        )
        assert cloned.status_code == 200 and cloned.content.startswith(b"RIFF")


async def test_preset_speakers_are_voices_on_both_transports(custom_voice_engine, tmp_path) -> None:
    async with (
        running_server(custom_voice_engine, tmp_path / "voices", max_patches=2) as running,
        httpx.AsyncClient(base_url=running.http_url, timeout=60) as http,
    ):
        speakers = list(running.server.engine.info.speakers)
        listed = {v["id"]: v["role"] for v in (await http.get("/v1/voices")).json()["data"]}
        assert "ryan" in speakers and listed == {"default": "zero_shot", **dict.fromkeys(speakers, "speaker")}
        assert (await http.delete("/v1/voices/ryan")).status_code == 409  # built in
        pcm = {}
        for voice in ("eric", "vivian", "default"):
            body = {"input": "Hi.", "voice": voice, "response_format": "pcm", "seed": 4}
            speech = await http.post("/v1/audio/speech", json=body)
            assert speech.status_code == 200 and len(speech.content) == 2 * 1920 * 2
            pcm[voice] = speech.content
        # The speaker reaches the model: text alone speaks as the default speaker (vivian), eric differs.
        assert pcm["vivian"] == pcm["default"] and pcm["eric"] != pcm["vivian"]
        ws = await Client.connect(running.ws_url)  # the 0.6B CustomVoice model takes no instruction
        model = ws.hello["model"]
        assert (model["family"], model["speakers"], model["instruction"]) == ("qwen3tts", speakers, False)
        assert set(speakers) <= set(ws.hello["voices"])
        await ws.send("context.create", ctx="a", voice="vivian", instruction="Fast.", text="Hi. ")
        refused = await ws.until_ended("a")
        assert (refused["code"], refused["ended"]) == ("unsupported", True)
        assert await spoken(ws, "b", voice="vivian", language="chinese")  # a language it takes
        await ws.close()
        refused_http = await http.post("/v1/audio/speech", json={**body, "instructions": "Fast."})
        assert refused_http.status_code == 400 and refused_http.json()["error"]["param"] == "instructions"


async def test_websocket_contexts_take_a_speaker_an_instruction_and_a_language(instructed_engine, tmp_path) -> None:
    async with running_server(instructed_engine, tmp_path / "voices", max_patches=2) as running:
        ws = await Client.connect(running.ws_url)
        speakers = list(running.server.engine.info.speakers)
        model = ws.hello["model"]
        assert (model["family"], model["speakers"], model["instruction"]) == ("qwen3tts", speakers, True)
        assert "english" in model["languages"] and set(speakers) <= set(ws.hello["voices"])
        seeded: dict[str, Any] = {"voice": "ryan", "generation": {"seed": 4}}
        plain = await spoken(ws, "plain", **seeded)
        assert plain and await spoken(ws, "again", **seeded) == plain  # seeded: what differs below is the field's
        instructed = await spoken(ws, "instructed", instruction="Cheerful, a little fast.", **seeded)
        english = await spoken(ws, "english", language="English", **seeded)
        assert instructed and english and instructed != plain and english != plain  # each reaches the model
        assert await spoken(ws, "eric", voice="eric", generation={"seed": 4}) != plain
        # Two segments on a model that does not continue its own audio: each starts from the voice and speaks.
        await spoken(ws, "two", "Hello there, my friend. How are you today? ", instruction="Slowly.", **seeded)
        assert [m["segment"] for m in ws.messages("segment.started", "two")] == [0, 1]
        for ctx, bad in (("e1", {"voice": "nobody"}), ("e2", {"language": "klingon"}), ("e3", {"instruction": 7})):
            await ws.send("context.create", ctx=ctx, text="Hi. ", **bad)
        errors = [await ws.until_ended(ctx) for ctx in ("e1", "e2", "e3")]
        assert [e["code"] for e in errors] == ["bad_voice", "unsupported", "bad_message"]
        assert "klingon" in errors[1]["message"] and not ws.messages("context.created", "e1")
        await ws.close()


async def test_speech_instructions_and_language_reach_a_model_that_takes_them(
    instructed_engine, voice_design_engine, tmp_path
) -> None:
    body = {"input": "Hi.", "voice": "default", "response_format": "pcm", "seed": 4}
    async with (
        running_server(instructed_engine, tmp_path / "a", max_patches=2) as running,
        httpx.AsyncClient(base_url=running.http_url, timeout=60) as http,
    ):
        plain = await http.post("/v1/audio/speech", json={**body, "voice": "vivian"})
        styled = await http.post(
            "/v1/audio/speech", json={**body, "voice": "vivian", "instructions": "Whisper.", "language": "english"}
        )
        assert plain.status_code == styled.status_code == 200 and len(styled.content) == 2 * 1920 * 2
        assert styled.content != plain.content
        refused = await http.post("/v1/audio/speech", json={**body, "language": "klingon"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "language"
    async with (
        running_server(voice_design_engine, tmp_path / "b", max_patches=2) as running,
        httpx.AsyncClient(base_url=running.http_url, timeout=60) as http,
    ):
        assert (await http.get("/info")).json()["model"]["instruction"] is True
        plain = await http.post("/v1/audio/speech", json=body)
        designed = await http.post("/v1/audio/speech", json={**body, "instructions": "A deep, slow voice."})
        assert plain.status_code == designed.status_code == 200 and plain.content != designed.content
        ws = await Client.connect(running.ws_url)
        assert ws.hello["model"]["speakers"] == [] and await spoken(ws, "a", instruction="A deep, slow voice.")
        await ws.close()
