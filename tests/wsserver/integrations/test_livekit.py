"""The LiveKit Agents plugin with the real framework (livekit-agents from PyPI) against a real server on the tiny
checkpoint: a streamed reply with its aligned transcript, `synthesize`, an interrupted stream, refused options and
a LoRA adapter."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from livekit.agents import APIStatusError, tts
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, TimedString

from tests.e2e.client import http_get
from tests.servers import ServeFactory
from wsserver.integrations.livekit import TTS

REPLY = "Sure, I can help with that. Your order ships on Monday. Anything else? "


async def collect(stream: tts.SynthesizeStream) -> list[tts.SynthesizedAudio]:
    return [ev async for ev in stream]


def transcripts(events: list[tts.SynthesizedAudio]) -> list[TimedString]:
    return [t for ev in events for t in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]


async def test_a_streamed_reply_is_one_context_with_an_aligned_transcript(serve: ServeFactory) -> None:
    async with serve(max_patches=3) as running:
        plugin = TTS(url=running.ws_url, sample_rate=24000)
        assert plugin.capabilities.streaming and plugin.capabilities.aligned_transcript
        plugin.prewarm()
        stream = plugin.stream()
        for word in REPLY.split(" ")[:-1]:
            stream.push_text(word + " ")
        stream.end_input()
        events = [ev async for ev in stream]
        assert plugin.model == "voxcpm2-tiny-nostop"  # the server's model, from hello
        await plugin.aclose()
        _, _, metrics = await http_get(running.http_url + "/metrics")
    assert events and {ev.frame.sample_rate for ev in events} == {24000}
    assert {ev.frame.num_channels for ev in events} == {1}
    assert len({ev.segment_id for ev in events}) == 1 and events[-1].is_final
    samples = sum(ev.frame.samples_per_channel for ev in events)
    timed = transcripts(events)
    assert "".join(timed) == REPLY  # the segments' text, exactly as sent
    # each segment is 3 patches of 160 ms; the segments tile the audio
    assert timed[0].start_time == 0 and timed[-1].end_time == pytest.approx(samples / 24000)
    for before, after in itertools.pairwise(timed):
        assert after.start_time == pytest.approx(before.end_time)
        assert round(after.start_time / 0.48, 6).is_integer()
    assert b'ttsws_contexts_total{outcome="done"} 1' in metrics


async def test_synthesize_and_several_streams_share_one_session(serve: ServeFactory) -> None:
    async with serve(max_patches=2) as running:
        plugin = TTS(url=running.ws_url, sample_rate=16000, voice="default")
        frame = await plugin.synthesize("A whole sentence at once. ").collect()
        assert frame.sample_rate == 16000 and frame.samples_per_channel > 0
        streams = [plugin.stream() for _ in range(2)]
        for i, stream in enumerate(streams):
            stream.push_text(f"Reply number {i}. ")
            stream.end_input()
        results = await asyncio.gather(*(collect(s) for s in streams))
        assert all(results) and "".join(transcripts(results[1])) == "Reply number 1. "
        _, _, status = await http_get(running.http_url + "/status")
        await plugin.aclose()
    assert b'"connections":{"active":1' in status  # every context went over the one session


async def test_aclose_interrupts_and_cancels_the_context_on_the_server(serve: ServeFactory) -> None:
    async with serve(max_patches=60) as running:
        plugin = TTS(url=running.ws_url, sample_rate=24000)
        stream = plugin.stream()
        stream.push_text(REPLY * 3)
        stream.end_input()
        first = await anext(stream)
        assert first.frame.samples_per_channel > 0
        await stream.aclose()
        await asyncio.sleep(0.3)
        _, _, metrics = await http_get(running.http_url + "/metrics")
        # the session stays open for the next reply
        after = plugin.stream()
        after.push_text("After the interruption. ")
        after.end_input()
        assert [ev async for ev in after]
        await plugin.aclose()
    assert b'ttsws_contexts_total{outcome="cancelled"} 1' in metrics
    # and the serve fixture checks on the way out that the engine let go of the request


# Each option reaches the server with the stream's context: the session's server (VoxCPM, no adapters) refuses it.
REFUSED = [
    ({"voice": "nobody"}, "bad_voice"),
    ({"lora": "nope"}, "bad_lora"),
    ({"instruction": "Cheerful."}, "unsupported"),
    ({"language": "english"}, "unsupported"),
]


@pytest.mark.parametrize(("option", "code"), REFUSED, ids=[next(iter(option)) for option, _ in REFUSED])
async def test_a_refused_option_is_a_status_error_that_is_not_retried(
    serve: ServeFactory, option: dict[str, str], code: str
) -> None:
    async with serve(max_patches=2) as running:
        plugin = TTS(url=running.ws_url, **option)
        stream = plugin.stream()
        stream.push_text("Hello. ")
        stream.end_input()
        with pytest.raises(APIStatusError) as failed:
            _ = [ev async for ev in stream]
        assert failed.value.status_code == 400 and not failed.value.retryable
        assert code in failed.value.message
        await plugin.aclose()


async def test_the_lora_option_generates_with_the_adapter(lora_serve: ServeFactory) -> None:
    async with lora_serve(max_patches=3) as running:
        seeded = {"generation": {"seed": 3}}
        plain, calm = TTS(url=running.ws_url, **seeded), TTS(url=running.ws_url, lora="calm", **seeded)
        frames = [await plugin.synthesize("Hello there. ").collect() for plugin in (plain, calm, calm)]
        await plain.aclose()
        await calm.aclose()
    without, with_lora, again = (bytes(frame.data) for frame in frames)
    assert len(without) == len(with_lora) and without != with_lora  # the adapter changed the audio
    assert with_lora == again  # and only the adapter: seeded, it is reproducible
