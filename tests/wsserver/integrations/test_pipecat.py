"""The Pipecat service in a real Pipecat pipeline (pipecat-ai from PyPI, its own test runner) against a real server on
the tiny checkpoint: an LLM turn streamed token by token, a spoken utterance, a barge-in, refused options, LoRA."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pipecat.frames.frames import (
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.tests.utils import SleepFrame, run_test

from tests.e2e.client import http_get
from tests.servers import ServeFactory
from wsserver.integrations.pipecat import VoxstreamTTSService

REPLY = "Sure, I can help with that. Your order ships on Monday. Anything else? "


def tokens(text: str) -> list[LLMTextFrame]:
    words = text.split(" ")
    return [LLMTextFrame(word + " ") for word in words[:-1] if word]


async def test_an_llm_turn_is_one_context_with_audio_and_segment_timed_text(serve: ServeFactory) -> None:
    async with serve(max_patches=3) as running:
        tts = VoxstreamTTSService(url=running.ws_url, sample_rate=16000)
        sent = [LLMFullResponseStartFrame(), *tokens(REPLY), LLMFullResponseEndFrame()]
        down, up = await run_test(tts, frames_to_send=sent)
        _, _, metrics = await http_get(running.http_url + "/metrics")
    assert not [f for f in up if "Error" in type(f).__name__]
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    texts = [f for f in down if isinstance(f, TTSTextFrame)]
    assert audio and {f.sample_rate for f in audio} == {16000} and {f.num_channels for f in audio} == {1}
    assert len({f.context_id for f in audio}) == 1  # one turn, one context
    assert " ".join(f.text for f in texts).split() == REPLY.split()  # every word, from the segments' captions
    kinds = [type(f) for f in down]
    assert kinds.index(TTSStartedFrame) < kinds.index(TTSAudioRawFrame) < kinds.index(TTSStoppedFrame)
    # The text frames are timed by their segment's audio: each segment here is 3 patches of 160 ms.
    assert [f.pts for f in texts] == sorted(f.pts for f in texts)
    assert len({f.pts for f in texts}) >= 2 and all((f.pts - texts[0].pts) % 480_000_000 == 0 for f in texts)
    assert b'ttsws_contexts_total{outcome="done"} 1' in metrics


async def test_a_spoken_utterance_and_then_a_turn_share_the_session(serve: ServeFactory) -> None:
    async with serve(max_patches=2) as running:
        tts = VoxstreamTTSService(url=running.ws_url, sample_rate=24000, voice="default")
        sent = [
            TTSSpeakFrame("Hello there. "),
            SleepFrame(1.0),
            LLMFullResponseStartFrame(),
            *tokens("How are you today? "),
            LLMFullResponseEndFrame(),
        ]
        down, _ = await run_test(tts, frames_to_send=sent)
        _, _, status = await http_get(running.http_url + "/metrics")
    contexts = {f.context_id for f in down if isinstance(f, TTSAudioRawFrame)}
    assert len(contexts) == 2
    assert b'ttsws_contexts_total{outcome="done"} 2' in status


async def test_an_interruption_cancels_the_context_on_the_server(serve: ServeFactory) -> None:
    turn = [LLMFullResponseStartFrame(), *tokens(REPLY * 6), LLMFullResponseEndFrame()]

    def seconds(frames: Sequence[Frame]) -> float:
        return sum(len(f.audio) for f in frames if isinstance(f, TTSAudioRawFrame)) / 2 / 24000

    async with serve(max_patches=60) as running:
        whole, _ = await run_test(VoxstreamTTSService(url=running.ws_url, sample_rate=24000), frames_to_send=turn)
        sent = [*turn, SleepFrame(1.5), InterruptionFrame(), SleepFrame(0.5)]  # some audio has come by then
        down, _ = await run_test(VoxstreamTTSService(url=running.ws_url, sample_rate=24000), frames_to_send=sent)
        _, _, metrics = await http_get(running.http_url + "/metrics")
    # the turn's audio stopped at the interruption, well before the end of its text (the tiny model on the CPU makes
    # audio several times faster than real time, so how much came first depends on the machine: the whole turn is
    # ~29 s, so the bound holds below ~10x real time, and 1.5 s leaves a loaded CI machine time for the first audio)
    assert 0 < seconds(down) < 0.5 * seconds(whole)
    assert b'ttsws_contexts_total{outcome="cancelled"} 1' in metrics
    # and the serve fixture checks on the way out that the engine let go of the request


async def test_options_the_server_refuses_are_error_frames(serve: ServeFactory) -> None:
    # Each option reaches the server with the turn's context: the session's server (VoxCPM, no adapters) refuses it.
    refused = {"voice": "nobody", "lora": "nope", "instruction": "Cheerful.", "language": "english"}
    codes = {"voice": "bad_voice", "lora": "bad_lora", "instruction": "unsupported", "language": "unsupported"}
    async with serve(max_patches=2) as running:
        runs = [
            run_test(
                VoxstreamTTSService(url=running.ws_url, sample_rate=24000, **{name: value}),
                frames_to_send=[TTSSpeakFrame("Hello. "), SleepFrame(0.5)],
            )
            for name, value in refused.items()
        ]
        ups = [up for _, up in await asyncio.gather(*runs)]  # Pipecat's runner takes seconds to wind down
    for name, up in zip(refused, ups, strict=True):
        errors = [f for f in up if "Error" in type(f).__name__]
        assert errors and f": {codes[name]}: " in errors[0].error and name in errors[0].error, name


async def test_the_lora_option_generates_with_the_adapter(lora_serve: ServeFactory) -> None:
    def audio(frames: Sequence[Frame]) -> bytes:
        return b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))

    async with lora_serve(max_patches=3) as running:
        # One after the other: run together, the requests may share a step or not, and a batch's float sums need not
        # round like a lone request's, so a seeded repeat would not be bit-exact (it failed once in CI so).
        (without, _), (with_lora, _), (again, _) = [
            await run_test(
                VoxstreamTTSService(url=running.ws_url, sample_rate=24000, generation={"seed": 3}, **option),
                frames_to_send=[TTSSpeakFrame("Hello there. "), SleepFrame(0.5)],
            )
            for option in ({}, {"lora": "calm"}, {"lora": "calm"})
        ]
    assert audio(without) and len(audio(without)) == len(audio(with_lora))
    assert audio(without) != audio(with_lora)  # the adapter changed the audio
    assert audio(with_lora) == audio(again)  # and only the adapter: seeded, it is reproducible
