"""The asyncio client against a real server on a loopback port: audio, captions, flush, the cancel fence, errors,
and reopening the session when the server is full, drains or closes it."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys

import numpy as np
import opuslib
import pytest

from tests.servers import ServeFactory, free_port
from wsserver.client import (
    Audio,
    Cancelled,
    Client,
    ContextFailed,
    Done,
    Flushed,
    Notice,
    Packet,
    Refused,
    Rejected,
    SegmentEnd,
    SegmentStart,
    Unavailable,
    websocket_url,
)

TEXT = "The first sentence is short. The second one takes a little longer to say. A third ends it. "


async def test_segments_carry_their_text_and_the_span_of_their_audio(serve: ServeFactory) -> None:
    async with serve(max_patches=3) as running, Client(running.ws_url) as client:
        ctx = await client.context(
            output={"format": "pcm_s16le", "sample_rate": 24000}, buffering={"max_segment_chars": 40}
        )
        for word in TEXT.split(" ")[:-1]:
            await ctx.append(word + " ")
        await ctx.end()
        events = [event async for event in ctx]
    audio = [e for e in events if isinstance(e, Audio)]
    starts = [e for e in events if isinstance(e, SegmentStart)]
    ends = [e for e in events if isinstance(e, SegmentEnd)]
    assert isinstance(events[-1], Done) and ctx.result == events[-1]
    assert len(starts) == len(ends) >= 3
    assert "".join(e.text for e in ends) == TEXT  # captions: exactly the text, in order
    samples = sum(a.samples for a in audio)
    assert samples == events[-1].audio_ms * 24
    # Each segment starts where the previous ended, the first at 0, the last ends with the audio.
    assert starts[0].start_s == 0 and ends[-1].end_s == pytest.approx(samples / 24000)
    for before, after in itertools.pairwise(ends):
        assert after.start_s == pytest.approx(before.end_s)
    # Every segment's start comes just before its first audio, its end just after its last.
    for start, end in zip(starts, ends, strict=True):
        first = events.index(start) + 1
        last = events.index(end) - 1
        assert isinstance(events[first], Audio) and events[first].segment == start.segment
        assert events[first].start_s == start.start_s
        assert isinstance(events[last], Audio) and events[last].last_of_segment
        assert events[last].start_s + events[last].duration_s == pytest.approx(end.end_s)


@pytest.mark.parametrize("fmt", ["opus", "mulaw"])
async def test_coded_audio_decodes_to_the_same_waveform_as_pcm(serve: ServeFactory, fmt: str) -> None:
    rate = 8000 if fmt == "mulaw" else 48000
    async with serve(max_patches=4) as running, Client(running.ws_url) as client:
        generation = {"seed": 7}
        reference = await client.synthesize(
            TEXT, output={"format": "pcm_f32le", "sample_rate": rate}, generation=generation
        )
        coded = await client.synthesize(
            TEXT, output={"format": fmt, "sample_rate": rate, "bitrate": 128000}, generation=generation
        )
    assert isinstance(coded.result, Done) and coded.sample_format == "s16le"
    want, got = reference.array(), coded.array().astype(np.float32) / 32767
    if fmt == "opus":  # the decoder's pre-skip is dropped: the decoded audio is that much shorter, not delayed
        assert got.size == want.size - opuslib.Encoder(rate, 1, opuslib.APPLICATION_AUDIO).lookahead
        want = want[: got.size]
    else:
        assert got.size == want.size
    assert np.corrcoef(want, got)[0, 1] > 0.9
    assert [s.text for s in coded.segments] == [s.text for s in reference.segments]


@pytest.mark.parametrize(("fmt", "rate"), [("opus", 48000), ("mulaw", 8000), ("pcm_s16le", 24000)])
async def test_an_undecoded_context_yields_the_frames_as_sent(serve: ServeFactory, fmt: str, rate: int) -> None:
    async with serve(max_patches=3) as running, Client(running.ws_url) as client:
        ctx = await client.context(output={"format": fmt, "sample_rate": rate}, text=TEXT, decode=False)
        await ctx.end()
        events = [event async for event in ctx]
    packets = [e for e in events if isinstance(e, Packet)]
    done = events[-1]
    assert isinstance(done, Done) and not any(isinstance(e, Audio) for e in events)
    assert [p.seq for p in packets] == list(range(len(packets))) and packets[-1].seq == done.last_seq
    assert all(p.format == fmt and p.sample_rate == rate and p.samples == rate // 50 for p in packets)  # 20 ms
    # counted from the packets, the audio lasts what the server says it sent
    assert sum(p.samples for p in packets) == done.audio_ms * rate // 1000
    assert [p.start_s for p in packets] == pytest.approx([p.seq * 0.02 for p in packets])
    with pytest.raises(ValueError, match="decode=False"):
        await ctx.collect()
    with pytest.raises(ValueError, match="decode=False"):
        await anext(ctx.audio())


async def test_flush_is_an_event_after_the_flushed_audio(serve: ServeFactory) -> None:
    async with serve(max_patches=3) as running, Client(running.ws_url) as client:
        ctx = await client.context(buffering={"mode": "manual"})
        await ctx.append("Only when flushed.")
        await ctx.flush()
        events = []
        async for event in ctx:
            events.append(event)
            if isinstance(event, Flushed):
                break
        assert events[-1] == Flushed(0) and isinstance(events[-2], SegmentEnd)
        await ctx.append(" More, then the end.", flush=True)
        await ctx.end()
        rest = [event async for event in ctx]
        assert Flushed(1) in rest and isinstance(rest[-1], Done)


async def test_cancel_returns_the_fence_and_nothing_of_the_context_follows(serve: ServeFactory) -> None:
    async with serve(max_patches=40) as running, Client(running.ws_url) as client:
        ctx = await client.context(text=TEXT)
        await ctx.end()
        received = []
        async for event in ctx:
            if isinstance(event, Audio):
                received.append(event)
                if len(received) == 3:
                    break
        fence = await ctx.cancel()
        assert fence.last_seq >= received[-1].seq
        assert [event async for event in ctx] == [fence]  # unread audio was dropped: only the end is left
        assert ctx.result == fence and await ctx.cancel() == fence  # cancelling again answers the same
        # the session goes on
        other = await client.synthesize("Still here. ")
        assert isinstance(other.result, Done)


async def test_errors_end_or_refuse_as_the_server_says(serve: ServeFactory) -> None:
    async with serve(max_patches=2, limits={"max_text_chars": 50}) as running, Client(running.ws_url) as client:
        with pytest.raises(ContextFailed) as failed:
            await client.context(voice="nobody")
        assert failed.value.code == "bad_voice"
        with pytest.raises(ContextFailed) as failed:
            await client.context(lora="nope")  # the session engine serves no adapters
        assert failed.value.code == "bad_lora" and "'nope'" in failed.value.message
        for field in ({"instruction": "Cheerful."}, {"language": "english"}):  # VoxCPM takes neither
            with pytest.raises(ContextFailed) as failed:
                await client.context(**field)
            assert failed.value.code == "unsupported"
        with pytest.raises(ContextFailed) as failed:
            await client.synthesize("x", output={"format": "opus", "sample_rate": 44100})
        assert failed.value.code == "bad_format"
        ctx = await client.context()
        await ctx.append("This is far too long to be accepted by a context of fifty characters. ")
        await ctx.append("Short. ")
        await ctx.end()
        events = [event async for event in ctx]
        refused = [e for e in events if isinstance(e, Refused)]
        assert [r.code for r in refused] == ["text_too_long"] and isinstance(events[-1], Done)
        assert "".join(e.text for e in events if isinstance(e, SegmentEnd)) == "Short. "


async def test_a_full_server_is_retried_until_a_session_frees(serve: ServeFactory) -> None:
    async with serve(max_patches=2, max_connections=1) as running:
        holder = Client(running.ws_url)
        await holder.connect()
        with pytest.raises(Unavailable, match="503"):
            await Client(running.ws_url, reconnect_timeout_s=0.3, max_retry_delay_s=0.1).connect()
        waiting = Client(running.ws_url, max_retry_delay_s=0.1)
        task = asyncio.create_task(waiting.synthesize("Once the other leaves. "))
        await asyncio.sleep(0.5)
        assert not task.done()
        await holder.close()
        assert isinstance((await task).result, Done)
        await waiting.close()


async def test_a_wrong_key_is_rejected_at_once(serve: ServeFactory) -> None:
    async with serve(max_patches=2, api_key="secret") as running:
        with pytest.raises(Rejected) as rejected:
            await Client(running.ws_url, api_key="guess").connect()
        assert rejected.value.status == 401
        async with Client(running.ws_url, api_key="secret") as client:
            assert isinstance((await client.synthesize("Let in. ")).result, Done)


async def test_a_session_closed_for_idleness_is_reopened_for_the_next_context(serve: ServeFactory) -> None:
    async with serve(max_patches=2, limits={"idle_timeout_s": 0.3}) as running, Client(running.ws_url) as client:
        first = await client.connect()
        async with asyncio.timeout(10):  # the server closes it after 0.3 s idle; a loaded machine notices later
            while first.lost is None:
                await asyncio.sleep(0.02)
        assert first.lost.code == 4408
        assert isinstance((await client.synthesize("After a pause. ")).result, Done)
        assert client.hello["session_id"] != first.hello["session_id"]


async def test_drain_finishes_open_contexts_and_new_ones_go_to_the_replacement(serve: ServeFactory) -> None:
    """A rolling restart on one port: the old server drains, the client's open context finishes there, the next
    context waits through 503 and refused connections until the new server takes it."""
    port = free_port()
    client = Client(f"ws://127.0.0.1:{port}", max_retry_delay_s=0.1)
    async with serve(max_patches=6, port=port, drain_timeout_s=10) as old:
        ctx = await client.context(text=TEXT)
        first_session = client.hello["session_id"]
        await ctx.end()
        draining = asyncio.create_task(old.server.drain())
        events = [event async for event in ctx]
        assert any(isinstance(e, Notice) and e.code == "draining" for e in events)
        assert isinstance(events[-1], Done)
        next_turn = asyncio.create_task(client.synthesize("On the new server. "))
        await draining
    await asyncio.sleep(0.3)  # nothing listens on the port now: the client keeps trying
    async with serve(max_patches=2, port=port):
        result = await next_turn
        assert isinstance(result.result, Done) and client.hello["session_id"] != first_session
        await client.close()


async def test_a_connection_closed_before_the_http_response_is_retried(serve: ServeFactory) -> None:
    """What a server shutting down does to a connection already in its accept backlog: closes it unanswered. The
    client treats that like a refused connection and keeps trying until a server answers."""
    port = free_port()
    dropped = asyncio.Event()

    def drop(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()
        dropped.set()

    dropping = await asyncio.start_server(drop, "127.0.0.1", port)
    client = Client(f"ws://127.0.0.1:{port}", max_retry_delay_s=0.1)
    next_turn = asyncio.create_task(client.synthesize("After the drop. "))
    await dropped.wait()
    dropping.close()
    await dropping.wait_closed()
    async with serve(max_patches=2, port=port):
        assert isinstance((await next_turn).result, Done)
        await client.close()


async def test_a_server_that_always_drops_the_connection_is_unavailable() -> None:
    port = free_port()
    dropping = await asyncio.start_server(lambda _r, writer: writer.close(), "127.0.0.1", port)
    async with dropping:
        with pytest.raises(Unavailable, match="HTTP response"):
            await Client(f"ws://127.0.0.1:{port}", reconnect_timeout_s=0.3, max_retry_delay_s=0.1).connect()


def test_the_client_imports_neither_torch_nor_the_engine() -> None:
    code = (
        "import sys, wsserver.client\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'engine', 'starlette', 'uvicorn', 'av'})\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_websocket_url_accepts_a_base_url() -> None:
    assert websocket_url("http://host:8000") == "ws://host:8000/v1/tts/ws"
    assert websocket_url("https://host/") == "wss://host/v1/tts/ws"
    assert websocket_url("ws://host:1/custom/path?token=k") == "ws://host:1/custom/path?token=k"


async def test_cancel_before_any_audio(serve: ServeFactory) -> None:
    async with serve(max_patches=2) as running, Client(running.ws_url) as client:
        ctx = await client.context(buffering={"mode": "manual"}, text="Never flushed.")
        assert await ctx.cancel() == Cancelled(-1)
