"""Incremental text: segments, flushes, manual mode, voice continuity, the slot FIFO, voices from a directory."""

from __future__ import annotations

import asyncio
import time
import wave
from pathlib import Path

import numpy as np

from engine import AsyncEngine, GenerationRequest
from tests.e2e.client import Client, Frame
from tests.servers import ServeFactory

TURN = "Sure, I can help with that. The first step is to open the settings page. Then choose the account tab. "


async def stream_words(client: Client, ctx: str, text: str, delay: float = 0.0) -> None:
    for word in text.split(" "):
        if word:
            await client.send("text.append", ctx=ctx, text=word + " ")
            await asyncio.sleep(delay)


async def test_token_stream_is_segmented_and_each_segment_continues_the_previous(serve: ServeFactory) -> None:
    async with serve(max_patches=6) as running:
        engine = running.server.engine
        assert engine is not None
        requests: list[tuple[float, GenerationRequest]] = []
        chunks: dict[str, list[np.ndarray]] = {}
        generate = AsyncEngine.generate

        last_patch_at: dict[str, float] = {}

        async def spy(request: GenerationRequest):  # records what reaches the real engine, changes nothing
            requests.append((time.monotonic(), request))
            async for chunk in generate(engine, request):
                chunks.setdefault(request.request_id, []).append(chunk.latents)
                last_patch_at[request.request_id] = time.monotonic()
                yield chunk

        engine.generate = spy  # type: ignore[method-assign]
        try:
            client = await Client.connect(running.ws_url)
            await client.send("context.create", ctx="turn", buffering={"first_min_chars": 10, "max_wait_ms": 5000})
            await stream_words(client, "turn", TURN, delay=0.01)
            await client.send("context.end", ctx="turn")
            done = await client.until_ended("turn")
        finally:
            del engine.generate
        assert done["type"] == "context.done"
        started = client.messages("segment.started", "turn")
        # the first segment ends early, at the first clause; text is never lost nor duplicated
        assert started[0]["text"] == "Sure, I can help with that. "[: len(started[0]["text"])]
        assert started[0]["text"].endswith(", ") or started[0]["text"].endswith(". ")
        assert "".join(s["text"] for s in started) == TURN
        assert len(requests) == len(started) >= 2
        for i, (_, request) in enumerate(requests):
            if i == 0:
                assert request.prompt.latents is None  # zero-shot voice
                continue
            previous = requests[i - 1][1]
            # continuation: the previous segment's text and the latents the engine generated for it
            assert request.prompt.text == previous.text
            np.testing.assert_array_equal(request.prompt.latents, np.stack(chunks[previous.request_id]))
        # Each later segment reached the engine before the audio already sent could have played out.
        handle = client.messages("context.created", "turn")[0]["handle"]
        frames = client.frames(handle)
        assert frames[-1].header.flags & 2
        # A segment needs the previous one's latents, so how soon it can start depends on the engine's speed (faster
        # than real time on a GPU, not always on a loaded CI CPU); what the server owns is the hand-off: each later
        # segment reaches the engine as soon as the previous one's last patch is out.
        for i in range(1, len(requests)):
            assert requests[i][0] - last_patch_at[requests[i - 1][1].request_id] < 0.5
        await client.close()


async def test_flush_answers_after_the_last_frame_of_the_flushed_text(serve: ServeFactory) -> None:
    async with serve(max_patches=4) as running:
        client = await Client.connect(running.ws_url)
        await client.send("context.create", ctx="f", buffering={"mode": "manual"})
        await client.send("text.append", ctx="f", text="Only on flush")
        await asyncio.sleep(0.3)
        assert not client.messages("segment.started")  # manual: nothing without a flush
        await client.send("context.flush", ctx="f")
        flushed = await client.until_message("context.flushed", "f")
        assert flushed["segment"] == 0
        handle = client.messages("context.created", "f")[0]["handle"]
        frames_before = [e for e in client.events[: client.events.index(flushed)] if isinstance(e, Frame)]
        assert frames_before and frames_before[-1].header.flags & 1  # the segment's last frame came first
        await client.send("text.append", ctx="f", text=" and more.", flush=True)
        assert (await client.until_message("context.flushed", "f"))["segment"] == 1
        await client.send("context.flush", ctx="f")  # nothing new buffered: answered at once
        assert (await client.until_message("context.flushed", "f"))["segment"] == 1
        await client.send("context.end", ctx="f")
        done = await client.until_ended("f")
        frames = client.frames(handle)
        assert frames[-1].payload == b"" and frames[-1].header.flags == 3  # end known after the last audio
        assert done["last_seq"] == frames[-1].header.seq
        await client.close()


async def test_contexts_beyond_the_engine_slots_wait_in_fifo_with_queue_status(serve: ServeFactory) -> None:
    async with serve(max_patches=8, max_num_seqs=1) as running:
        clients = [await Client.connect(running.ws_url) for _ in range(3)]
        for i, client in enumerate(clients):
            await client.send("context.create", ctx=f"c{i}", text=f"Client number {i} speaks now. ")
            await client.send("context.end", ctx=f"c{i}")
            await asyncio.sleep(0.05)
        done = [await client.until_ended(f"c{i}") for i, client in enumerate(clients)]
        assert all(d["type"] == "context.done" for d in done)
        assert not clients[0].messages("queue.status")
        assert [m["position"] for m in clients[1].messages("queue.status")] == [1]
        assert [m["position"] for m in clients[2].messages("queue.status")] == [2, 1]
        assert done[2]["metrics"]["queue_ms"] > done[1]["metrics"]["queue_ms"] > done[0]["metrics"]["queue_ms"]
        for client in clients:
            await client.close()


async def test_prompt_voice_from_a_voices_dir(serve: ServeFactory, tmp_path: Path) -> None:
    t = np.arange(16000) / 16000
    samples = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    with wave.open(str(tmp_path / "alice.wav"), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes(samples.tobytes())
    (tmp_path / "alice.txt").write_text("This is Alice speaking.")
    async with serve(max_patches=3, voices_dir=tmp_path) as running:
        client = await Client.connect(running.ws_url)
        assert client.hello["voices"] == ["default", "alice"]
        await client.send("context.create", ctx="v", voice="alice", text="Hello from Alice. ")
        await client.send("context.end", ctx="v")
        assert (await client.until_ended("v"))["type"] == "context.done"
        await client.close()
