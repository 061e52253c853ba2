"""A Qwen3-TTS checkpoint behind the real server: /info, speech over HTTP, a WebSocket segment, and a Base voice
cloned by upload (x-vector alone: role reference; ICL: role both) used on both transports."""

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


@pytest.fixture(scope="module")
def qwen_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from engine import AsyncEngine, EngineConfig

    checkpoint = make_checkpoint("base-0.6b", "tiny", tmp_path_factory.mktemp("qwen3tts") / "base")
    config = EngineConfig(model=str(checkpoint), device="cpu", max_num_seqs=4, max_patches=8, kv_block_size=16,
                          max_model_len=256, coalesce_ms=1)  # fmt: skip
    engine = AsyncEngine(config)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    yield engine
    loop.run_until_complete(engine.close())
    loop.close()


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
