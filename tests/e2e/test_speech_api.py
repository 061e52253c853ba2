"""`POST /v1/audio/speech` over a real server: every format streamed and whole, SSE, disconnects, stalls, limits."""

from __future__ import annotations

import asyncio
import base64
import io
import socket
import time

import av
import httpx
import orjson
import pytest
import soundfile as sf

from tests.e2e.client import Client
from tests.servers import ServeFactory, wait_idle
from wsserver.encoding import FORMATS
from wsserver.speech import segments

TEXT = "Hello there. This is a test of the speech endpoint."


def samples_in(fmt: str, data: bytes, rate: int) -> int:
    """Samples in a response body, by a decoder other than the encoder's where one exists (libsndfile)."""
    if fmt == "pcm":
        return len(data) // 2
    if fmt in ("aac", "flac"):  # libsndfile reads no AAC, nor a FLAC stream of unknown length
        with av.open(io.BytesIO(data)) as container:
            return sum(frame.samples for frame in container.decode(audio=0))
    samples, file_rate = sf.read(io.BytesIO(data), dtype="float32")
    assert file_rate == rate
    return samples.shape[0]


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_every_format_streamed_and_whole(serve: ServeFactory, fmt: str) -> None:
    async with serve(max_patches=4) as running, httpx.AsyncClient(base_url=running.http_url, timeout=60) as http:
        body = {"input": TEXT, "voice": "alloy", "response_format": fmt, "seed": 3}
        whole = await http.post("/v1/audio/speech", json={**body, "stream": False})
        assert whole.status_code == 200 and whole.headers["Content-Type"] == FORMATS[fmt].content_type
        assert int(whole.headers["Content-Length"]) == len(whole.content)
        announced = int(whole.headers["X-Audio-Samples"])
        assert int(whole.headers["X-Sample-Rate"]) == 24000
        patches = len(segments(TEXT)) * 4  # the no-stop checkpoint runs every segment to max_patches
        assert announced == patches * running.server.engine.info.samples_per_patch // 2  # 48 -> 24 kHz
        async with http.stream("POST", "/v1/audio/speech", json=body) as streamed:
            assert streamed.status_code == 200 and "Content-Length" not in streamed.headers
            assert streamed.headers["Transfer-Encoding"] == "chunked"
            chunks = [chunk async for chunk in streamed.aiter_raw()]
        assert len(chunks) > 1
        exact = fmt in ("pcm", "wav", "flac", "opus")
        for data, is_whole in ((whole.content, True), (b"".join(chunks), False)):
            count = samples_in(fmt, data, 24000)
            if exact or (fmt == "mp3" and is_whole):
                assert count == announced, (fmt, is_whole)
            else:  # MP3 and AAC streams carry their encoder's priming and padding
                assert announced <= count <= announced + 2 * 1152, (fmt, is_whole)


async def test_server_sent_events(serve: ServeFactory) -> None:
    async with serve(max_patches=3) as running, httpx.AsyncClient(base_url=running.http_url, timeout=60) as http:
        body = {"input": TEXT, "voice": "nova", "response_format": "pcm", "stream_format": "sse", "sample_rate": 16000}
        response = await http.post("/v1/audio/speech", json=body)
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [orjson.loads(line[6:]) for line in response.text.split("\n\n") if line.startswith("data: ")]
        assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
        audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        done = events[-1]
        patches = len(segments(TEXT)) * 3
        assert done["type"] == "speech.audio.done" and done["usage"]["output_tokens"] == patches
        assert len(audio) // 2 == done["usage"]["audio_samples"] == patches * 7680 // 3  # 48 -> 16 kHz


async def test_a_client_that_hangs_up_frees_the_engine_at_once(serve: ServeFactory, engine: object) -> None:
    async with serve(max_patches=64) as running, httpx.AsyncClient(base_url=running.http_url, timeout=60) as http:
        body = {
            "input": "A long answer that the listener interrupts. " * 4,
            "voice": "default",
            "response_format": "pcm",
        }
        async with http.stream("POST", "/v1/audio/speech", json=body) as response:
            async for _ in response.aiter_raw():
                break  # audio is flowing: the request holds an engine slot
            assert engine.stats().running == 1
        steps = engine.stats().steps
        await wait_idle(engine)
        # At once: within the few steps under way when the server noticed, not the answer's other ~250 patches.
        assert engine.stats().steps - steps <= 8
        assert running.server.speeches == set() and not running.server.link.coordinator.queue.holders


async def test_a_request_that_hangs_up_while_queued_leaves_the_queue(serve: ServeFactory) -> None:
    async with serve(max_patches=64, max_num_seqs=1) as running, httpx.AsyncClient(base_url=running.http_url) as http:
        ws = await Client.connect(running.ws_url)
        await ws.send("context.create", ctx="busy", text="This context holds the only engine slot for a while. ")
        await ws.send("context.end", ctx="busy")
        await ws.until_message("segment.started", "busy")
        request = asyncio.create_task(http.post("/v1/audio/speech", json={"input": "Waiting.", "voice": "default"}))
        while not running.server.link.coordinator.queue.waiting:
            await asyncio.sleep(0.01)
        request.cancel()  # the client goes away before its request gets a slot
        await asyncio.gather(request, return_exceptions=True)
        while running.server.speeches:
            await asyncio.sleep(0.01)
        assert not running.server.link.coordinator.queue.waiting
        await ws.send("context.cancel", ctx="busy")
        await ws.until_ended("busy")
        await ws.close()


async def test_a_client_that_stops_reading_loses_its_request(serve: ServeFactory, engine: object) -> None:
    limits = {"stall_timeout_s": 1.0, "send_buffer_bytes": 16384}
    async with serve(max_patches=64, limits=limits) as running:
        port = int(running.http_url.rsplit(":", 1)[1])
        body = orjson.dumps(
            {"input": "Read me if you can. " * 4, "voice": "default", "response_format": "pcm", "sample_rate": 48000}
        )
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)  # and never read
        try:
            while not running.server.speeches:
                await asyncio.sleep(0.01)
            started = time.monotonic()
            while running.server.speeches:
                # Not sleep(0): a loop that never idles holds the GIL against the engine's thread (its CPU steps
                # ran ~17x slower and the request outlived the bound). The server counts the stall and forgets the
                # request with no await between, so any poll that sees it gone sees the stall counted.
                await asyncio.sleep(0.01)
                assert time.monotonic() - started < 15, "a client that does not read kept its request"
            assert running.server.metrics.errors["stalled"] == 1
            await wait_idle(engine, timeout=2)
        finally:
            sock.close()


async def test_limits_and_the_api_key(serve: ServeFactory) -> None:
    async with (
        serve(max_connections=1, api_key="sekret") as running,
        httpx.AsyncClient(base_url=running.http_url) as http,
    ):
        body = {"input": "Hi.", "voice": "default", "response_format": "pcm"}
        refused = await http.post("/v1/audio/speech", json=body)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert (await http.get("/v1/voices")).status_code == 401
        assert (await http.get("/health")).status_code == 200 and (await http.get("/info")).status_code == 200
        auth = {"Authorization": "Bearer sekret"}
        assert (await http.post("/v1/audio/speech", json=body, headers=auth)).status_code == 200
        too_big = await http.post("/v1/audio/speech", content=b" " * (2 << 20), headers=auth)
        assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "body_too_large"
        ws = await Client.connect(running.ws_url + "?token=sekret")  # the only seat
        full = await http.post("/v1/audio/speech", json=body, headers=auth)
        assert full.status_code == 503 and int(full.headers["Retry-After"]) > 0
        assert full.json()["error"]["code"] == "over_capacity"
        await ws.close()


async def test_info_and_models(serve: ServeFactory) -> None:
    async with serve() as running, httpx.AsyncClient(base_url=running.http_url) as http:
        info = (await http.get("/info")).json()
        model = running.server.engine.info
        assert info["model"]["name"] == model.name and info["model"]["sample_rate"] == model.sample_rate
        assert info["model"]["family"] == "voxcpm" and info["model"]["continuation"] is True
        assert info["model"]["speakers"] == [] and info["model"]["instruction"] is False
        assert info["speech"]["formats"]["pcm"]["content_type"] == "audio/pcm"
        assert model.sample_rate in info["speech"]["formats"]["wav"]["sample_rates"]
        assert info["voices"]["uploads"]["max_bytes"] > 0 and info["voices"]["roles"] == ["prompt", "reference", "both"]
        assert info["voices"]["uploads"]["max_name_chars"] == 64
        assert info["websocket"]["limits"]["max_contexts"] == 8
        models = (await http.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]][:2] == [model.name, "tts-1"]
