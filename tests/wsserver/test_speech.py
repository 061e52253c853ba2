"""`POST /v1/audio/speech` bodies: what OpenAI's clients send is accepted, anything else is refused by field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.wsserver.models import QWEN3_CUSTOM, VOXCPM2
from wsserver.http import ApiError
from wsserver.speech import parse_speech, segments
from wsserver.voices import DEFAULT_VOICE, OPENAI_VOICES, VoiceStore, speaker_voices

VOICES = VoiceStore("tiny-vae", aliases=dict.fromkeys(OPENAI_VOICES, DEFAULT_VOICE))
QWEN_VOICES = VoiceStore("qwen-codec", fixed=speaker_voices(QWEN3_CUSTOM), aliases={"alloy": "vivian"})


def parse(**body: Any) -> Any:
    return parse_speech(orjson.dumps({"input": "Hello.", "voice": "alloy", **body}), VOICES, VOXCPM2, 100)


def test_what_openai_clients_send() -> None:
    pipecat = parse(
        model="gpt-4o-mini-tts", response_format="pcm"
    )  # Pipecat: OpenAI voice names, pcm, no stream_format
    assert (pipecat.response_format, pipecat.sample_rate, pipecat.stream, pipecat.sse) == ("pcm", 24000, True, False)
    assert pipecat.voice.id == DEFAULT_VOICE
    livekit = parse(model="tts-1", response_format="mp3", speed=1.0, stream_format="sse")
    assert livekit.sse and livekit.response_format == "mp3"
    plain = parse()
    assert plain.response_format == "mp3" and plain.generation.seed is None
    extended = parse(voice={"id": "default"}, seed=5, cfg_value=1.5, inference_timesteps=4, sample_rate=48000)
    assert (extended.generation.seed, extended.generation.cfg_value, extended.sample_rate) == (5, 1.5, 48000)
    assert not parse(stream=False).stream
    assert parse(response_format="wav", sample_rate=48000).sample_rate == 48000  # the model's own rate


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (b"{nope", 400, "bad_json", None),
        (b"[1, 2]", 400, "bad_request", None),
        ({"input": None}, 400, "missing_field", "input"),
        ({"voice": None}, 400, "missing_field", "voice"),
        ({"input": 5}, 400, "bad_request", "input"),
        ({"input": "   "}, 400, "empty_input", "input"),
        ({"input": "x" * 101}, 400, "text_too_long", "input"),
        ({"voice": "nobody"}, 400, "unknown_voice", "voice"),
        ({"voice": {"name": "alloy"}}, 400, "unknown_voice", "voice"),
        ({"model": "whisper-1"}, 404, "model_not_found", "model"),
        ({"response_format": "ogg"}, 400, "unsupported_format", "response_format"),
        ({"response_format": "opus", "sample_rate": 44100}, 400, "unsupported_format", "sample_rate"),
        ({"speed": 1.5}, 400, "unsupported", "speed"),
        ({"speed": "fast"}, 400, "bad_request", "speed"),
        ({"instructions": "whisper"}, 400, "unsupported", "instructions"),
        ({"instructions": 3}, 400, "bad_request", "instructions"),
        ({"language": "english"}, 400, "unsupported", "language"),
        ({"language": ["english"]}, 400, "bad_request", "language"),
        ({"stream_format": "chunks"}, 400, "bad_request", "stream_format"),
        ({"stream": False, "stream_format": "sse"}, 400, "bad_request", "stream"),
        ({"stream": "no"}, 400, "bad_request", "stream"),
        ({"seed": True}, 400, "bad_request", "seed"),
        ({"cfg_value": 50}, 400, "bad_request", None),
        ({"inference_timesteps": 0}, 400, "bad_request", None),
    ],
)
def test_bad_bodies_are_refused_by_field(body: Any, status: int, code: str, param: str | None) -> None:
    with pytest.raises(ApiError) as error:
        if isinstance(body, bytes):
            parse_speech(body, VOICES, VOXCPM2, 100)
        else:
            parse(**body)
    assert (error.value.status, error.value.code, error.value.param) == (status, code, param)
    assert error.value.body()["error"]["message"]


def qwen(**body: Any) -> Any:
    return parse_speech(orjson.dumps({"input": "Hello.", **body}), QWEN_VOICES, QWEN3_CUSTOM, 100)


def test_a_model_with_speakers_and_instructions_takes_openais_instructions_and_a_language() -> None:
    parsed = qwen(voice="vivian", instructions="Speak softly.", language="English")
    assert (parsed.voice.speaker, parsed.instruction, parsed.language) == ("vivian", "Speak softly.", "english")
    assert qwen(voice="alloy").voice.speaker == "vivian"  # an alias may name a speaker
    plain = qwen(voice="default", instructions="")
    assert (plain.voice.speaker, plain.instruction, plain.language) == ("", "", "")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"voice": "serena"}, "unknown_voice", "voice"),
        ({"voice": "vivian", "language": "klingon"}, "unsupported", "language"),
        ({"voice": "vivian", "instructions": "x" * 1001}, "bad_request", "instructions"),
    ],
)
def test_what_a_model_with_speakers_does_not_take_is_refused(body: Any, code: str, param: str) -> None:
    with pytest.raises(ApiError) as error:
        qwen(**body)
    assert (error.value.status, error.value.code, error.value.param) == (400, code, param)


def test_long_input_is_cut_into_segments_that_the_engine_reads() -> None:
    text = "Hi there, friend! " + " ".join(f"This is sentence {word}." for word in ["one", "two", "three"] * 20)
    pieces = segments(text)
    assert len(pieces) > 3 and all(len(piece) <= 300 for piece in pieces)
    assert all(piece.endswith(".") for piece in pieces)  # whole sentences: prosody across each
    assert " ".join(pieces) == text.strip() and segments("12 apples.") == ["twelve apples."]
    assert segments("  \n  ") == []
