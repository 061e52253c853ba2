"""The five numbered guarantees of the protocol page, each over a real socket against the real engine."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from tests.e2e.client import Client, Frame, http_get
from tests.servers import ServeFactory
from wsserver.server import ABORT_CLOSE_S

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "


def check_ordering(frames: list[Frame], sample_bytes: int) -> None:
    """Guarantee 1: seq from 0 without gaps; pts advances by exactly the previous frame's samples."""
    assert [f.header.seq for f in frames] == list(range(len(frames)))
    pts = 0
    for frame in frames:
        assert frame.header.pts == pts
        pts += len(frame.payload) // sample_bytes


async def test_ordering_across_interleaved_contexts(serve: ServeFactory) -> None:
    async with serve(max_patches=6) as running:
        client = await Client.connect(running.ws_url)
        for ctx, fmt in (("a", "pcm_s16le"), ("b", "pcm_f32le"), ("c", "mulaw")):
            await client.send("context.create", ctx=ctx, output={"format": fmt})
        for word in (SENTENCE * 2).split(" "):  # token by token, the three interleaved
            for ctx in "abc":
                await client.send("text.append", ctx=ctx, text=word + " ")
        for ctx in "abc":
            await client.send("context.end", ctx=ctx)
        done = {ctx: await client.until_ended(ctx) for ctx in "abc"}
        for ctx, sample_bytes in (("a", 2), ("b", 4), ("c", 1)):
            assert done[ctx]["type"] == "context.done"
            handle = client.messages("context.created", ctx)[0]["handle"]
            frames = client.frames(handle)
            assert len(frames) > 10
            check_ordering(frames, sample_bytes)
            assert done[ctx]["last_seq"] == frames[-1].header.seq
            assert frames[-1].header.flags & 2  # last frame of the context
            assert [f.header.segment for f in frames] == sorted(f.header.segment for f in frames)
        await client.close()


async def test_cancel_fence(serve: ServeFactory) -> None:
    async with serve(max_patches=40) as running:
        client = await Client.connect(running.ws_url)
        await client.send("context.create", ctx="turn", text=SENTENCE)
        await client.send("context.end", ctx="turn")
        await client.until(lambda e: isinstance(e, Frame) and e.header.seq >= 3)
        await client.send("context.cancel", ctx="turn")
        cancelled = await client.until_message("context.cancelled", "turn")
        handle = client.messages("context.created", "turn")[0]["handle"]
        frames = client.frames(handle)
        assert cancelled["last_seq"] == frames[-1].header.seq
        assert not client.messages("context.done", "turn")
        # Nothing of that context after the fence, and the engine lets go of the request.
        await client.send("ping", t=1)
        await client.until_message("pong")
        await asyncio.sleep(0.5)
        await client.send("ping", t=2)
        await client.until_message("pong")
        fence = client.events.index(cancelled)
        assert not [e for e in client.events[fence:] if isinstance(e, Frame) and e.header.handle == handle]
        _, _, body = await http_get(running.http_url + "/status")
        assert b'"generating":0' in body
        await client.close()


async def test_cancel_unknown_or_finished_context_answers_minus_one(serve: ServeFactory) -> None:
    async with serve(max_patches=3) as running:
        client = await Client.connect(running.ws_url)
        await client.send("context.cancel", ctx="never-seen")
        assert (await client.until_message("context.cancelled", "never-seen"))["last_seq"] == -1
        await client.send("context.create", ctx="short", text="Hi there. ")
        await client.send("context.end", ctx="short")
        assert (await client.until_ended("short"))["type"] == "context.done"
        await client.send("context.cancel", ctx="short")
        assert (await client.until_message("context.cancelled", "short"))["last_seq"] == -1
        assert not client.messages("error")
        await client.close()


async def test_nothing_lost_every_context_ends_and_bad_messages_hurt_no_one(serve: ServeFactory) -> None:
    async with serve(max_patches=4, limits={"max_contexts": 4}) as running:
        client = await Client.connect(running.ws_url)
        await client.send("context.create", ctx="done", text="One sentence here. ")
        await client.send("context.create", ctx="cancelled", text=SENTENCE)
        await client.send("context.create", ctx="bad", output={"format": "mp3"})  # refused: error with ctx
        await client.ws.send("{not json")
        await client.send("text.append", ctx="done", text=42)
        await client.send("context.end", ctx="done")
        await client.send("context.cancel", ctx="cancelled")
        await client.send("context.create", ctx="trailing", text="No end of sentence")
        await client.send("context.end", ctx="trailing")  # unterminated text is still spoken at end
        endings = {ctx: (await client.until_ended(ctx))["type"] for ctx in ("done", "cancelled", "bad", "trailing")}
        assert endings == {
            "done": "context.done",
            "cancelled": "context.cancelled",
            "bad": "error",
            "trailing": "context.done",
        }
        codes = [e["code"] for e in client.messages("error")]
        assert codes == ["bad_format", "bad_json", "bad_message"]
        assert all(not e["fatal"] for e in client.messages("error"))
        trailing = client.messages("context.created", "trailing")[0]["handle"]
        assert client.frames(trailing)  # it was spoken
        assert client.messages("segment.started", "trailing")[0]["text"] == "No end of sentence"
        await client.close()


async def test_isolation_a_client_that_never_reads_is_paused_then_closed(serve: ServeFactory) -> None:
    limits = {"send_buffer_bytes": 16384, "stall_timeout_s": 2.0}
    async with serve(max_patches=60, limits=limits) as running:
        # The reader side of the slow client: a tiny receive window and a tiny client-side queue.
        slow = await Client.connect(running.ws_url, max_queue=1)
        sock = slow.ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        healthy = await Client.connect(running.ws_url)
        await slow.send("context.create", ctx="slow", output={"format": "pcm_f32le"}, text=SENTENCE * 3)
        await slow.send("context.end", ctx="slow")
        # The slow client now reads nothing. Its context pauses (no engine work) ...
        paused = False
        for _ in range(100):
            _, _, body = await http_get(running.http_url + "/status")
            if b'"paused":1' in body:
                paused = True
                break
            await asyncio.sleep(0.05)
        assert paused
        # ... while another session is served as usual ...
        await healthy.send("context.create", ctx="fast", text="A quick reply for the other user. ")
        await healthy.send("context.end", ctx="fast")
        assert (await healthy.until_ended("fast"))["type"] == "context.done"
        # ... and after the stall timeout the slow one is closed with 4408 and its request aborted.
        for _ in range(100):
            if running.server.metrics.closes.get(4408):
                break
            await asyncio.sleep(0.05)
        assert running.server.metrics.closes[4408] == 1
        with pytest.raises(ConnectionClosed):  # once it reads again, it finds the connection gone
            while True:
                await slow.next_event(timeout=10)
        _, _, body = await http_get(running.http_url + "/status")
        assert b'"connections":{"active":1' in body
        await healthy.close()


async def test_isolation_a_fatal_close_of_a_client_that_never_reads_is_bounded_by_the_stall_timeout(
    serve: ServeFactory,
) -> None:
    """A close decided for another reason (here 4400) cannot wait on a client that does not read for longer than
    the stall rule allows: the session, and its engine work, are gone within stall_timeout_s + ABORT_CLOSE_S."""
    stall_timeout_s = 3.0
    limits = {"send_buffer_bytes": 16384, "stall_timeout_s": stall_timeout_s, "max_bad_messages": 1}
    async with serve(max_patches=60, limits=limits) as running:
        slow = await never_reading_client(running.ws_url)
        await slow.send("context.create", ctx="slow", output={"format": "pcm_f32le"}, text=SENTENCE * 3)
        await slow.send("context.end", ctx="slow")
        await until_status(running.http_url, b'"paused":1')
        loop = asyncio.get_running_loop()
        fatal_at = loop.time()
        for _ in range(2):  # over max_bad_messages: a fatal error, then close 4400 after the output
            await slow.ws.send("garbage")
        await until_status(running.http_url, b'"connections":{"active":0', timeout=stall_timeout_s + ABORT_CLOSE_S + 2)
        assert loop.time() - fatal_at <= stall_timeout_s + ABORT_CLOSE_S + 1
        assert running.server.metrics.closes == {4400: 1}  # forced, not turned into a stall close
        _, _, body = await http_get(running.http_url + "/status")
        assert b'"running":0,"waiting":0,"paused":0' in body, body
        with pytest.raises(ConnectionClosed):  # once it reads again, it finds the connection gone
            while True:
                await slow.next_event(timeout=10)


async def test_isolation_a_close_handshake_the_client_never_answers_is_cut_at_the_stall_timeout(
    serve: ServeFactory,
) -> None:
    """The output went out but the client reads nothing more, so it never answers the close frame: the server aborts
    the transport after stall_timeout_s, not after websockets' own close timeout (10 s)."""
    stall_timeout_s = 2.0
    async with serve(limits={"stall_timeout_s": stall_timeout_s, "max_message_bytes": 1000}) as running:
        client = await Client.connect(running.ws_url)
        client.ws.transport.pause_reading()  # from now on it reads nothing, not even the server's close frame
        loop = asyncio.get_running_loop()
        fatal_at = loop.time()
        await client.send("ping", t="x" * 2000)  # over max_message_bytes: a fatal error, then close 4413
        await until_status(running.http_url, b'"connections":{"active":0', timeout=stall_timeout_s + 3)
        assert loop.time() - fatal_at <= stall_timeout_s + 1
        assert running.server.metrics.closes == {4413: 1}


async def never_reading_client(url: str) -> Client:
    """A client whose application stops reading: a tiny receive window and a tiny client-side queue."""
    client = await Client.connect(url, max_queue=1)
    client.ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return client


async def until_status(http_url: str, fragment: bytes, timeout: float = 5) -> None:
    """Poll /status until its JSON contains `fragment`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while fragment not in (body := (await http_get(http_url + "/status"))[2]):
        assert loop.time() < deadline, f"{fragment!r} not in /status after {timeout} s: {body!r}"
        await asyncio.sleep(0.05)


async def test_disconnect_mid_stream_aborts_engine_work(serve: ServeFactory) -> None:
    async with serve(max_patches=60) as running:
        client = await Client.connect(running.ws_url)
        for ctx in ("x", "y"):
            await client.send("context.create", ctx=ctx, text=SENTENCE)
            await client.send("context.end", ctx=ctx)
        await client.until(lambda e: isinstance(e, Frame))
        engine = running.server.engine
        assert engine is not None
        for _ in range(100):  # the engine's stats are a snapshot taken after each step
            if engine.stats().running >= 1:
                break
            await asyncio.sleep(0.01)
        assert engine.stats().running >= 1  # the real engine is busy with this session
        client.ws.transport.abort()  # vanish without a close handshake
        for _ in range(100):
            _, _, body = await http_get(running.http_url + "/status")
            if b'"running":0,"waiting":0,"paused":0' in body and b'"connections":{"active":0' in body:
                break
            await asyncio.sleep(0.05)
        assert b'"running":0,"waiting":0,"paused":0' in body, body
        assert b'"contexts":{"active":0,"generating":0,"queued":0,"paused":0}' in body


async def test_pcm_payloads_are_the_model_audio(serve: ServeFactory) -> None:
    """s16 and f32 of the same seeded context carry the same waveform (within s16 rounding)."""
    async with serve(max_patches=4) as running:
        client = await Client.connect(running.ws_url)
        for ctx, fmt in (("s16", "pcm_s16le"), ("f32", "pcm_f32le")):
            await client.send(
                "context.create",
                ctx=ctx,
                output={"format": fmt},
                generation={"seed": 7},
                text="Same words, same seed. ",
            )
            await client.send("context.end", ctx=ctx)
            await client.until_ended(ctx)
        audio = {}
        for ctx, dtype in (("s16", "<i2"), ("f32", "<f4")):
            handle = client.messages("context.created", ctx)[0]["handle"]
            audio[ctx] = np.concatenate([np.frombuffer(f.payload, dtype) for f in client.frames(handle)])
        assert audio["s16"].size == audio["f32"].size
        assert np.abs(audio["s16"] / 32767 - np.clip(audio["f32"], -1, 1)).max() < 1e-3
        await client.close()
