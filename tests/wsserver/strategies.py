"""Hypothesis strategies for what ttsws/1 clients send, shared by the property-based tests of the sans-I/O core."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.wsserver.models import QWEN3_CUSTOM
from wsserver import messages as m

VOICES = ("default", "warm")
# The model the generated settings are checked against: one that takes instructions and languages, so that both
# are exercised (good values are accepted, the rest refused).
MODEL = QWEN3_CUSTOM
CTX_IDS = ("a", "b", "c", "d")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# Text that exercises segmentation and normalisation: words, boundaries, numbers, currencies, markdown, CJK, emoji.
PIECES = (
    *("Hello", "there", "Dr.", "e.g.", "3.5", "$1,200.50", "€3m", "12:30pm", "45%", "21st", "1990", "-7", "J."),
    *(" ", " ", " ", "  ", "\n", "\n\n", "\t", ", ", ". ", "! ", "? ", "… ", "; ", " — ", ": ", '." ', ".) "),
    *("**bold**", "`code`", "# ", "- ", "[link](http://x)", "😀", "👍🏽", "\u00a0", "“quoted”"),
    *("你好", "。", "！", "，", "こんにちは", "안녕", "Ω", "ß", "\u0301", "\ufeff", "\x00"),
)
texts = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.text(max_size=40),
    st.builds(lambda piece, n: piece * n, st.sampled_from(PIECES), st.integers(20, 400)),
)
ctx_ids = st.sampled_from(CTX_IDS) | st.text(max_size=3) | st.just("x" * 129)


def settings_values(name: str) -> st.SearchStrategy[Any]:
    """Good and bad values for one settings field."""
    good = {
        "format": st.sampled_from((*m.FORMATS, "wav", "")),
        "sample_rate": st.sampled_from((None, 8000, 12000, 16000, 22050, 24000, 44100, 48000, 0, -1, 2**70)),
        "frame_ms": st.sampled_from((10, 20, 25, 40, 60, 1000, 5, 0, 1001)),
        "bitrate": st.sampled_from((6000, 32000, 510000, 5999)),
        "mode": st.sampled_from(("auto", "manual", "AUTO")),
        "first_min_chars": st.integers(-1, 1001),
        "max_wait_ms": st.sampled_from((0, 1, 300, 60000, 60001, -5)),
        "max_segment_chars": st.sampled_from((20, 21, 50, 300, 4000, 19, 4001)),
        "cfg_value": st.floats(-1, 11, allow_nan=False) | st.integers(-1, 11),
        "temperature": st.floats(-0.5, 2.5, allow_nan=False),
        "inference_timesteps": st.integers(0, 101),
        "seed": st.none() | st.integers(-1, 2**64),
    }[name]
    return good | json_values


GROUPS = {
    "output": ("format", "sample_rate", "frame_ms", "bitrate"),
    "buffering": ("mode", "first_min_chars", "max_wait_ms", "max_segment_chars"),
    "generation": ("cfg_value", "temperature", "inference_timesteps", "seed"),
}


def settings_group(name: str) -> st.SearchStrategy[Any]:
    fields = {key: settings_values(key) for key in GROUPS[name]}
    return st.fixed_dictionaries({}, optional={**fields, "unknown": json_values}) | json_values


settings_fields = st.fixed_dictionaries(
    {},
    optional={
        "voice": st.sampled_from((*VOICES, "nobody")) | json_values,
        "instruction": st.sampled_from(("", "Speak softly.", "x" * (m.MAX_INSTRUCTION_CHARS + 1))) | json_values,
        "language": st.sampled_from(("", *MODEL.languages, "ENGLISH", "klingon")) | json_values,
        "output": settings_group("output"),
        "buffering": settings_group("buffering"),
        "generation": settings_group("generation"),
    },
)


@st.composite
def client_messages(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(
        st.sampled_from(
            (
                *("context.create", "text.append", "text.append", "text.append", "context.flush", "context.end"),
                *("context.cancel", "session.update", "ping", "nonsense", ""),
            )
        )
    )
    message: dict[str, Any] = {"type": kind}
    if kind.startswith(("context.", "text.")):
        message["ctx"] = draw(ctx_ids)
    if kind in ("context.create", "text.append"):
        message["text"] = draw(texts)
    if kind == "text.append" and draw(st.booleans()):
        message["flush"] = draw(st.booleans())
    if kind == "context.create":
        message |= draw(settings_fields)
    if kind == "session.update":
        message["defaults"] = draw(settings_fields)
    if kind == "ping":
        message["t"] = draw(json_values)
    # Now and then a field of the wrong type, a missing field or an unknown one.
    if draw(st.integers(0, 9)) == 0:
        message[draw(st.sampled_from(("type", "ctx", "text", "flush", "t", "id")))] = draw(json_values)
    if draw(st.integers(0, 19)) == 0 and len(message) > 1:
        del message[draw(st.sampled_from(sorted(message)))]
    return message


@st.composite
def frames(draw: st.DrawFn) -> str | bytes:
    """One WebSocket message as the session receives it."""
    how = draw(st.integers(0, 19))
    if how == 0:
        return draw(st.binary(max_size=30))
    if how == 1:
        return draw(st.text(max_size=30))  # mostly not JSON
    if how == 2:
        return json.dumps(draw(json_values))  # JSON that is not a message
    if how == 3:  # nested deeper than a JSON encoder's recursion limit
        depth = draw(st.integers(200, 1100))
        return '{"type":"ping","t":' + "[" * depth + "]" * depth + "}"
    message = draw(client_messages())
    # Both encodings of non-ASCII characters; big integers and non-finite numbers only stdlib json writes.
    data = json.dumps(message, ensure_ascii=draw(st.booleans()))
    return data.encode() if how == 4 else data
