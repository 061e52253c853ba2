from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import ModelInfo
from tests.wsserver.models import QWEN3_CUSTOM, VOXCPM2
from tests.wsserver.strategies import MODEL, VOICES, frames, settings_fields
from wsserver import messages as m
from wsserver.errors import ErrorCode, ProtocolError


def parse(**message: object) -> m.ClientMessage:
    return m.parse_client_message(orjson.dumps(message))


def code_of(data: str | bytes) -> tuple[ErrorCode, str | None]:
    with pytest.raises(ProtocolError) as exc:
        m.parse_client_message(data)
    return exc.value.code, exc.value.ctx


def test_parse_each_client_message() -> None:
    assert parse(type="ping", t=[1]) == m.Ping([1])
    assert parse(type="text.append", ctx="a", text="hi", flush=True, id="ignored") == m.TextAppend("a", "hi", True)
    assert parse(type="context.end", ctx="a") == m.ContextEnd("a")
    create = parse(
        type="context.create",
        ctx="a",
        voice="v",
        output={"format": "opus", "sample_rate": None},
        generation={"cfg_value": 2, "seed": 3},
    )
    assert create == m.ContextCreate(
        "a",
        m.SettingsPatch(
            voice="v", output={"format": "opus", "sample_rate": None}, generation={"cfg_value": 2.0, "seed": 3}
        ),
    )
    assert isinstance(create.settings.generation["cfg_value"], float)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("{", (ErrorCode.BAD_JSON, None)),
        ("[]", (ErrorCode.BAD_MESSAGE, None)),
        ('{"type": 1}', (ErrorCode.BAD_MESSAGE, None)),
        ('{"type": "nope"}', (ErrorCode.UNKNOWN_TYPE, None)),
        ('{"type": "text.append", "ctx": "a"}', (ErrorCode.BAD_MESSAGE, "a")),
        ('{"type": "text.append", "ctx": "", "text": ""}', (ErrorCode.BAD_MESSAGE, None)),
        ('{"type": "text.append", "ctx": "a", "text": "x", "flush": 1}', (ErrorCode.BAD_MESSAGE, "a")),
        ('{"type": "context.create", "ctx": "a", "output": {"frame_ms": true}}', (ErrorCode.BAD_MESSAGE, "a")),
        ('{"type": "context.create", "ctx": "a", "output": {"codec": "x"}}', (ErrorCode.BAD_MESSAGE, "a")),
        ('{"type": "session.update"}', (ErrorCode.BAD_MESSAGE, None)),
    ],
)
def test_schema_errors(data: str, expected: tuple[ErrorCode, str | None]) -> None:
    assert code_of(data) == expected


def test_output_resolution() -> None:
    assert m.OutputSettings().resolved(48000).sample_rate == 48000
    assert m.OutputSettings(format="opus").resolved(44100).sample_rate == 48000
    assert m.OutputSettings(format="mulaw").resolved(48000).sample_rate == 8000
    assert m.OutputSettings(sample_rate=44100).resolved(44100).sample_rate == 44100  # the native rate is fine
    for bad in (
        m.OutputSettings(format="mp3"),
        m.OutputSettings(sample_rate=44100),
        m.OutputSettings(format="mulaw", sample_rate=16000),
        m.OutputSettings(format="opus", frame_ms=30),
        m.OutputSettings(format="opus", bitrate=1000),
        m.OutputSettings(frame_ms=5),
    ):
        with pytest.raises(ProtocolError) as exc:
            bad.resolved(48000)
        assert exc.value.code == ErrorCode.BAD_FORMAT


def test_settings_merge_is_partial_and_all_or_nothing() -> None:
    base = m.Settings()
    merged = base.merged(
        m.SettingsPatch(output={"format": "opus"}, buffering={"max_wait_ms": 50}), ("default",), VOXCPM2
    )
    assert merged.output.format == "opus" and merged.output.frame_ms == 20 and merged.buffering.max_wait_ms == 50
    with pytest.raises(ProtocolError):  # a good field next to a bad one changes nothing
        merged.merged(m.SettingsPatch(output={"frame_ms": 40}, generation={"temperature": 5.0}), ("default",), VOXCPM2)
    with pytest.raises(ProtocolError) as exc:
        base.merged(m.SettingsPatch(voice="bob"), ("default",), VOXCPM2)
    assert exc.value.code == ErrorCode.BAD_VOICE
    assert merged.effective(48000)["output"]["sample_rate"] == 48000


def test_serialize_leaves_out_absent_optional_fields() -> None:
    assert orjson.loads(m.serialize(m.ErrorMessage("bad_json", "x"))) == {
        "type": "error",
        "code": "bad_json",
        "message": "x",
        "fatal": False,
    }
    assert orjson.loads(m.serialize(m.ContextCancelled("a", -1))) == {
        "type": "context.cancelled",
        "ctx": "a",
        "last_seq": -1,
    }


def test_a_ping_nested_too_deeply_to_echo_is_refused() -> None:
    """Found by the fuzzer: orjson parses 1024 levels of nesting but serializes 254, so the pong raised TypeError out
    of the session (the connection died with 1011 instead of an error message)."""

    def ping(depth: int) -> str:
        return '{"type": "ping", "t": ' + "[" * depth + "]" * depth + "}"

    assert code_of(ping(300)) == (ErrorCode.BAD_MESSAGE, None)
    assert code_of(ping(254)) == (ErrorCode.BAD_MESSAGE, None)  # the limit is the pong's: `t` is one level down in it
    m.serialize(m.Pong(m.parse_client_message(ping(253)).t))


# -- properties (hypothesis) ---------------------------------------------------------------------------------------


@given(data=frames() | st.binary(max_size=64) | st.text(max_size=64))
def test_parsing_anything_fails_only_with_a_protocol_error(data: str | bytes) -> None:
    try:
        message = m.parse_client_message(data)
    except ProtocolError as exc:
        assert exc.code in (ErrorCode.BAD_JSON, ErrorCode.BAD_MESSAGE, ErrorCode.UNKNOWN_TYPE)
        return
    if isinstance(message, m.Ping):
        m.serialize(m.Pong(message.t))  # whatever a ping carries can be echoed


@given(patch=settings_fields)
def test_merging_any_settings_fails_only_with_a_protocol_error_or_gives_whole_valid_settings(patch: dict) -> None:
    try:
        parsed = m.parse_client_message(json.dumps({"type": "session.update", "defaults": patch}))  # big ints too
        assert isinstance(parsed, m.SessionUpdate)
        merged = m.Settings().merged(parsed.defaults, VOICES, MODEL)
    except ProtocolError as exc:
        refusals = (ErrorCode.BAD_JSON, ErrorCode.BAD_MESSAGE, ErrorCode.BAD_FORMAT, ErrorCode.BAD_VOICE)
        assert exc.code in (*refusals, ErrorCode.UNSUPPORTED)
        return
    orjson.dumps(merged.effective(24000))  # a merged patch is whole and valid: it resolves and serializes


# -- instruction and language: checked against the model ----------------------------------------------------------


def test_instruction_and_language_are_parsed_from_a_create_and_type_checked() -> None:
    create = parse(type="context.create", ctx="a", voice="vivian", instruction="Speak softly.", language="English")
    assert isinstance(create, m.ContextCreate)
    assert (create.settings.voice, create.settings.instruction, create.settings.language) == (
        "vivian",
        "Speak softly.",
        "English",
    )
    assert parse(type="context.create", ctx="a").settings.instruction is None  # absent: keep the defaults
    for bad in ({"instruction": 5}, {"language": None}, {"instruction": ["a"]}):
        with pytest.raises(ProtocolError) as exc:
            parse(type="context.create", ctx="a", **bad)
        assert exc.value.code == ErrorCode.BAD_MESSAGE and exc.value.ctx == "a"


def test_a_model_with_instructions_and_languages_takes_them() -> None:
    merged = m.Settings().merged(
        m.SettingsPatch(instruction="Speak softly.", language="ENGLISH"), ("default",), QWEN3_CUSTOM
    )
    assert (merged.instruction, merged.language) == ("Speak softly.", "english")  # the model's spelling
    effective = merged.effective(QWEN3_CUSTOM.sample_rate)
    assert (effective["instruction"], effective["language"]) == ("Speak softly.", "english")
    kept = merged.merged(m.SettingsPatch(), ("default",), QWEN3_CUSTOM)  # a patch without them keeps them
    assert (kept.instruction, kept.language) == ("Speak softly.", "english")
    cleared = merged.merged(m.SettingsPatch(instruction="", language=""), ("default",), QWEN3_CUSTOM)
    assert (cleared.instruction, cleared.language) == ("", "")


@pytest.mark.parametrize(
    ("model", "patch", "code", "words"),
    [
        (VOXCPM2, {"instruction": "Speak softly."}, ErrorCode.UNSUPPORTED, "takes no instruction"),
        (VOXCPM2, {"language": "english"}, ErrorCode.UNSUPPORTED, "takes no language"),
        (QWEN3_CUSTOM, {"language": "klingon"}, ErrorCode.UNSUPPORTED, "'klingon'; the model takes ['auto'"),
        (QWEN3_CUSTOM, {"instruction": "x" * (m.MAX_INSTRUCTION_CHARS + 1)}, ErrorCode.BAD_MESSAGE, "exceeds"),
        (QWEN3_CUSTOM, {"voice": "nobody"}, ErrorCode.BAD_VOICE, "unknown voice"),
    ],
)
def test_what_the_model_does_not_take_is_refused_by_name(
    model: ModelInfo, patch: dict[str, str], code: ErrorCode, words: str
) -> None:
    base = m.Settings(instruction="Keep me.") if model.instruction else m.Settings()
    with pytest.raises(ProtocolError) as exc:
        base.merged(m.SettingsPatch(**patch), ("default",), model)
    assert exc.value.code == code and words in exc.value.message
    assert m.checked_instruction("", model) == "" and m.checked_language("", model) == ""  # "" always passes
