"""Audio on the wire: Opus decodes with libopus to the announced sample counts; PCM and mu-law at every rate."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import opuslib
import pytest

from engine import AsyncEngine, EngineConfig, GenerationParams, GenerationRequest
from engine.sequence import Sequence
from tests.e2e.client import Client
from tests.e2e.test_guarantees import check_ordering
from tests.servers import ServeFactory, running_server
from wsserver.audio import _OpusCodec
from wsserver.protocol import Outgoing, Session

TEXT = "Opus frames should decode to exactly the announced number of samples. "


@pytest.mark.parametrize(("rate", "frame_ms"), [(48000, 20), (16000, 60), (8000, 10)])
async def test_opus_frames_decode_to_the_announced_sample_counts(serve: ServeFactory, rate: int, frame_ms: int) -> None:
    async with serve(max_patches=5) as running:
        client = await Client.connect(running.ws_url)
        output = {"format": "opus", "sample_rate": rate, "frame_ms": frame_ms, "bitrate": 24000}
        await client.send("context.create", ctx="o", output=output, text=TEXT)
        await client.send("context.end", ctx="o")
        done = await client.until_ended("o")
        created = client.messages("context.created", "o")[0]
        assert created["output"] == {**output, "channels": 1}
        handle = created["handle"]
        [codec] = client.frames(handle, kind=2)
        assert client.events.index(codec) < client.events.index(client.frames(handle)[0])  # OpusHead first
        assert codec.payload[:8] == b"OpusHead" and codec.payload[9] == 1  # mono
        assert int.from_bytes(codec.payload[12:16], "little") == rate
        frames = client.frames(handle)
        decoder = opuslib.Decoder(rate, 1)
        samples = rate * frame_ms // 1000
        for frame in frames:
            if frame.payload:  # an empty last frame only carries the end flag
                assert len(decoder.decode(frame.payload, samples)) == 2 * samples
        # pts counts 48 kHz ticks whatever the coded rate
        assert [f.header.pts for f in frames] == [i * frame_ms * 48 for i in range(len(frames))]
        assert done["audio_ms"] == pytest.approx(frame_ms * sum(1 for f in frames if f.payload))
        await client.close()


@pytest.mark.parametrize(
    ("fmt", "rate", "sample_bytes"),
    [("pcm_s16le", 24000, 2), ("pcm_f32le", 16000, 4), ("pcm_s16le", 48000, 2), ("mulaw", 8000, 1)],
)
async def test_pcm_and_mulaw_frames(serve: ServeFactory, fmt: str, rate: int, sample_bytes: int) -> None:
    async with serve(max_patches=3) as running:
        client = await Client.connect(running.ws_url)
        await client.send("session.update", defaults={"output": {"format": fmt, "sample_rate": rate, "frame_ms": 20}})
        updated = await client.until_message("session.updated")
        assert updated["effective"]["output"]["sample_rate"] == rate
        await client.send("text.append", ctx="p", text="Resampled audio, framed at twenty milliseconds. ")
        await client.send("context.end", ctx="p")
        done = await client.until_ended("p")
        handle = client.messages("context.created", "p")[0]["handle"]
        frames = client.frames(handle)
        audio = [f for f in frames if f.payload]
        assert {len(f.payload) for f in audio} == {rate // 50 * sample_bytes}
        check_ordering(frames, sample_bytes)
        # 3 patches of 7680 samples at 48 kHz = 480 ms, padded up to whole frames
        assert done["audio_ms"] == 480
        await client.close()


async def drain(stream: AsyncIterator[object]) -> None:
    async for _ in stream:
        pass


async def test_a_steps_opus_chunks_leave_a_cushion_per_session_in_turn(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One engine step gives three sessions a chunk of 7 frames each. Each frame is encoded as its session's writer
    sends it, and a writer hands over to the next session's once its client holds TURN_CUSHION_S (three frames or
    four): the first frame leaves before any other is encoded, and each session gets its cushion before the next
    session's first frame. Turns of one frame left each player a single frame ahead; encoded on arrival, the third
    session's first frame waited for 14 others."""
    events: list[tuple[str, int]] = []  # ("encode", encoder) and ("send", session), in order
    encode = _OpusCodec.encode
    next_outgoing = Session.next_outgoing

    def spy_encode(codec: _OpusCodec, frame: np.ndarray) -> bytes:
        events.append(("encode", id(codec)))
        return encode(codec, frame)

    def spy_next(session: Session, now: float) -> Outgoing | None:
        item = next_outgoing(session, now)
        if item is not None and not item.text:
            events.append(("send", id(session)))
        return item

    monkeypatch.setattr(_OpusCodec, "encode", spy_encode)
    monkeypatch.setattr(Session, "next_outgoing", spy_next)
    # A wide burst window, opened by a lead request that streams meanwhile (engine.engine_loop): the three segments
    # gather behind it and are admitted in one step, so their first chunks arrive together.
    config = EngineConfig(
        model=str(tiny_checkpoint("voxcpm2", stop=False)), device="cpu", coalesce_ms=2000, coalesce_max_ms=10_000
    )
    engine = AsyncEngine(config)
    await engine.start()
    admitted: list[int] = []
    schedule = engine.core.scheduler.schedule

    def recording_schedule() -> list[Sequence]:
        batch = schedule()
        admitted.append(sum(seq.is_prefill for seq in batch))
        return batch

    engine.core.scheduler.schedule = recording_schedule
    try:
        async with running_server(engine, tmp_path / "voices", max_patches=2) as running:
            clients = [await Client.connect(running.ws_url) for _ in range(3)]
            lead = engine.generate(GenerationRequest(text="A lead.", params=GenerationParams(max_patches=1000)))
            await anext(lead)
            streaming = asyncio.create_task(drain(lead))
            for client in clients:
                await client.send("context.create", ctx="c", output={"format": "opus", "sample_rate": 48000}, text=TEXT)
                await client.send("context.end", ctx="c")
            for client in clients:
                await client.until_ended("c")
                await client.close()
            streaming.cancel()  # cancels the lead's request (AsyncEngine.generate)
            await asyncio.gather(streaming, return_exceptions=True)
    finally:
        await engine.close()
    assert [n for n in admitted if n] == [1, 3]  # the lead, then the three segments together
    encoders = [who for what, who in events if what == "encode"]
    runs = [len(list(run)) for _, run in itertools.groupby(encoders)]
    first_turns = encoders[: sum(runs[:3])]
    assert len(set(first_turns)) == 3 and all(3 <= run <= 4 for run in runs[:3]), runs
    assert events[1][0] == "send", events[:4]  # the first frame left before the second was encoded
