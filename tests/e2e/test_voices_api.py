"""`/v1/voices` over a real server: clone, list, use on the WebSocket and over HTTP, delete while in use, restart,
and every bad upload answered with its own error while nothing else is lost."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf

from tests.e2e.client import Client
from tests.servers import REPO, ServeFactory, free_port, running_server
from wsserver.decoding import UploadLimits


def clip(seconds: float = 1.5, rate: int = 16000, pitch: float = 220, fmt: str = "WAV") -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(buffer, 0.3 * np.sin(2 * np.pi * pitch * t), rate, format=fmt)
    return buffer.getvalue()


async def upload(client: httpx.AsyncClient, audio: bytes | None = None, **fields: str) -> httpx.Response:
    fields = {"name": "Alice", "transcript": "This is Alice speaking.", **fields}
    files = {"audio": ("clip.wav", clip() if audio is None else audio, "audio/wav")}
    return await client.post("/v1/voices", files=files, data=fields)


def error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_clone_list_use_and_delete(serve: ServeFactory) -> None:
    async with serve(max_patches=3) as running, httpx.AsyncClient(base_url=running.http_url, timeout=30) as http:
        earlier = await Client.connect(running.ws_url)  # a session opened before the voice existed
        created = await upload(http)
        assert created.status_code == 201
        voice = created.json()
        assert voice["id"].startswith("vc_") and voice["name"] == "Alice" and voice["role"] == "prompt"
        assert voice["duration_s"] == 1.5
        assert (await upload(http, name="Another name")).json()["id"] == voice["id"]  # same content, same voice
        listing = (await http.get("/v1/voices")).json()
        assert [v["id"] for v in listing["data"]] == ["default", voice["id"]] and listing["aliases"][
            "alloy"
        ] == "default"
        assert (await http.get(f"/v1/voices/{voice['id']}")).json() == voice

        assert earlier.hello["voices"] == ["default"]
        await earlier.send("context.create", ctx="e", voice=voice["id"], text="New voice, old session. ")
        await earlier.send("context.end", ctx="e")
        assert (await earlier.until_ended("e"))["type"] == "context.done"
        await earlier.close()
        ws = await Client.connect(running.ws_url)
        assert ws.hello["voices"] == ["default", voice["id"]]
        await ws.send("context.create", ctx="c", voice=voice["id"], text="Hello from Alice. ")
        await ws.send("context.end", ctx="c")
        assert (await ws.until_ended("c"))["type"] == "context.done"
        speech = await http.post(
            "/v1/audio/speech", json={"input": "Hi.", "voice": voice["id"], "response_format": "wav"}
        )
        assert speech.status_code == 200 and speech.content.startswith(b"RIFF")

        assert (await http.delete(f"/v1/voices/{voice['id']}")).json()["deleted"] is True
        assert error(await http.get(f"/v1/voices/{voice['id']}")) == (404, "voice_not_found")
        assert error(await http.delete(f"/v1/voices/{voice['id']}")) == (404, "voice_not_found")
        assert error(await http.delete("/v1/voices/default")) == (409, "voice_fixed")
        await ws.send("context.create", ctx="gone", voice=voice["id"])
        assert (await ws.until_message("error", "gone"))["code"] == "bad_voice"
        await ws.close()


async def test_roles_and_concurrent_uploads(serve: ServeFactory) -> None:
    async with (
        serve(uploads=UploadLimits(max_concurrent=6)) as running,
        httpx.AsyncClient(base_url=running.http_url, timeout=60) as http,
    ):
        clips = [clip(pitch=200 + 40 * i) for i in range(6)]
        roles = ["prompt", "reference", "both"] * 2
        responses = await asyncio.gather(
            *(
                upload(http, audio, role=role, transcript="" if role == "reference" else "Words.")
                for audio, role in zip(clips, roles, strict=True)
            )
        )
        assert [r.status_code for r in responses] == [201] * 6
        assert [r.json()["role"] for r in responses] == roles
        voices = running.server.voices
        assert len(voices.ids()) == 7
        for response in responses:
            voice = voices.get(response.json()["id"])
            assert (voice.latents is None) == (voice.role == "reference")
            assert (voice.reference_latents is None) == (voice.role == "prompt")


async def test_deleting_a_voice_in_use_breaks_nothing(serve: ServeFactory) -> None:
    async with serve(max_patches=8) as running, httpx.AsyncClient(base_url=running.http_url, timeout=30) as http:
        voice_id = (await upload(http)).json()["id"]
        ws = await Client.connect(running.ws_url)
        await ws.send("context.create", ctx="c", voice=voice_id, buffering={"mode": "manual"})
        await ws.send("text.append", ctx="c", text="First part of a long turn. ", flush=True)
        await ws.until_message("segment.started", "c")
        assert (await http.delete(f"/v1/voices/{voice_id}")).status_code == 200
        await ws.send("text.append", ctx="c", text="Second part, after the voice was deleted. ")
        await ws.send("context.end", ctx="c")
        assert (await ws.until_ended("c"))["type"] == "context.done"
        assert len(ws.messages("segment.started", "c")) == 2
        await ws.close()


async def test_bad_uploads_get_clear_errors_and_lose_nothing(serve: ServeFactory) -> None:
    async with (
        serve(uploads=UploadLimits(max_bytes=200_000, max_duration_s=5.0), max_voices=2) as running,
        httpx.AsyncClient(base_url=running.http_url, timeout=30) as http,
    ):
        kept = (await upload(http)).json()["id"]
        cases: list[tuple[dict[str, Any], tuple[int, str]]] = [
            ({"data": {"name": "x", "transcript": "y"}}, (400, "missing_field")),  # no audio
            ({"audio": clip(), "name": ""}, (400, "missing_field")),
            ({"audio": clip(), "transcript": ""}, (400, "missing_field")),
            ({"audio": clip(), "role": "narrator"}, (400, "bad_request")),
            ({"audio": clip(), "name": "x" * 65}, (400, "bad_request")),
            ({"audio": clip(), "name": "bell\x07"}, (400, "bad_request")),
            ({"audio": clip(), "transcript": "w" * 1001}, (400, "transcript_too_long")),
            ({"audio": b"\x00" * 10}, (400, "audio_corrupt")),
            ({"audio": clip(0.2)}, (400, "audio_too_short")),
            ({"audio": clip(6)}, (400, "audio_too_long")),
            ({"audio": b""}, (400, "audio_empty")),
            ({"audio": clip(2, pitch=0)}, (400, "audio_silent")),
            ({"audio": clip(7)}, (413, "audio_too_big")),
        ]
        for case, expected in cases:
            if "data" in case:  # a multipart form without the audio
                response = await http.post("/v1/voices", data=case["data"], files={"note": ("a.txt", b"hi")})
            else:
                response = await upload(http, **case)
            assert error(response) == expected, (case, response.text)
        not_a_form = await http.post("/v1/voices", json={"audio": "base64?"})
        assert error(not_a_form) == (400, "bad_form")
        huge = await http.post(
            "/v1/voices", content=b"x" * 300_000, headers={"Content-Type": "multipart/form-data; boundary=b"}
        )
        assert error(huge) == (413, "body_too_large")
        assert (await upload(http, clip(pitch=300))).status_code == 201
        assert error(await upload(http, clip(pitch=400))) == (409, "too_many_voices")
        assert kept in running.server.voices.ids() and len(running.server.voices.ids()) == 3


async def test_reference_roles_need_a_reference_model(engine_v1: Any, tmp_path: Path) -> None:
    async with (
        running_server(engine_v1, tmp_path / "voices") as running,
        httpx.AsyncClient(base_url=running.http_url, timeout=30) as http,
    ):
        assert error(await upload(http, role="both")) == (400, "unsupported")
        assert (await upload(http, clip(rate=16000))).status_code == 201


async def test_voices_survive_a_real_restart(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    store = tmp_path / "voices"
    async with (
        server_process(tiny_checkpoint("voxcpm2"), store) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        voice = (await upload(http)).json()
    async with (
        server_process(tiny_checkpoint("voxcpm2"), store) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        assert (await http.get(f"/v1/voices/{voice['id']}")).json() == voice
        speech = await http.post(
            "/v1/audio/speech", json={"input": "Still here.", "voice": voice["id"], "response_format": "pcm"}
        )
        assert speech.status_code == 200 and len(speech.content) > 0


@asynccontextmanager
async def server_process(checkpoint: Path, store: Path) -> AsyncIterator[str]:
    """`python -m wsserver` as deployed, until SIGTERM."""
    port = free_port()
    args = ["--model", str(checkpoint), "--device", "cpu", "--port", str(port), "--voices-store", str(store)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "wsserver", *args, "--max-patches", "4", "--drain-timeout-s", "2",
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url) as probe:
            for _ in range(600):
                await asyncio.sleep(0.1)
                try:
                    if (await probe.get("/ready")).status_code == 200:
                        break
                except httpx.TransportError:
                    continue
            else:
                raise AssertionError(f"the server on port {port} was not ready within 60 s")
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert await asyncio.wait_for(process.wait(), 30) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_concurrent_uploads_beyond_the_limit_wait_their_turn(serve: ServeFactory) -> None:
    async with (
        serve(uploads=UploadLimits(max_concurrent=1)) as running,
        httpx.AsyncClient(base_url=running.http_url, timeout=30) as http,
    ):
        boundary = "slowboundary"
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nSlow\r\n',
            f'--{boundary}\r\nContent-Disposition: form-data; name="transcript"\r\n\r\nWords.\r\n',
            f'--{boundary}\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n\r\n',
        ]
        arrived = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield "".join(parts).encode()
            arrived.set()
            await asyncio.sleep(0.5)  # the upload is in progress while the body trickles in
            yield clip() + f"\r\n--{boundary}--\r\n".encode()

        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        slow = asyncio.create_task(http.post("/v1/voices", content=slow_body(), headers=headers))
        await arrived.wait()
        await asyncio.sleep(0.1)
        busy = await upload(http, clip(pitch=500))
        assert error(busy) == (429, "too_many_uploads") and busy.headers["Retry-After"] == "1"
        assert (await slow).status_code == 201
        assert (await upload(http, clip(pitch=500))).status_code == 201
