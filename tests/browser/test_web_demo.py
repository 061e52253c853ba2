"""The web demo in headless Chromium against a real server on the tiny checkpoint.

Each test drives the page the way a person would (select, type, click) and checks two things: what
the page shows, and that what it decoded matches what the server sent, counted independently from
the frames Playwright saw on the wire.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import Frame, running

pytestmark = pytest.mark.browser

TEXT = "Hello there. This sentence is spoken by the tiny test model, frame by frame."
PARAGRAPH = (
    "Streaming speech starts before the sentence is finished. Each word arrives as the model writes it, "
    "and the audio follows a moment later. Nothing waits for the whole paragraph."
)
# Long enough that the audio is still coming when the test presses Cancel.
LONG_TEXT = " ".join(["This turn keeps talking until somebody interrupts it, one clause after another."] * 12)

FADE_SAMPLES = 384  # playout-worklet.js FADE_MS (8 ms) at 48 kHz
BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1}


# ---- helpers


def opus_packet_samples(packet: bytes) -> int:
    """Samples (at 48 kHz) in one Opus packet, from its TOC byte (RFC 6716 section 3.1)."""
    toc = packet[0]
    config = toc >> 3
    if config < 12:  # SILK: 10, 20, 40, 60 ms
        frame_samples = (480, 960, 1920, 2880)[config % 4]
    elif config < 16:  # hybrid: 10, 20 ms
        frame_samples = (480, 960)[config % 2]
    else:  # CELT: 2.5, 5, 10, 20 ms
        frame_samples = (120, 240, 480, 960)[config % 4]
    code = toc & 3
    frames = 1 if code == 0 else 2 if code in (1, 2) else packet[1] & 0x3F
    return frames * frame_samples


def sent_samples(frames: list[Frame], fmt: str) -> int:
    audio = [f for f in frames if f.kind == 1]
    if fmt == "opus":
        return sum(opus_packet_samples(f.payload) for f in audio)
    return sum(len(f.payload) for f in audio) // BYTES_PER_SAMPLE[fmt]


def opus_pre_skip(frames: list[Frame]) -> int:
    """OpusHead pre-skip (RFC 7845 section 5.1): the decoder drops that many samples at the start."""
    head = next(f.payload for f in frames if f.kind == 2)
    assert head[:8] == b"OpusHead"
    return int.from_bytes(head[10:12], "little")


def wire_messages(page: Any, type_: str, ctx: str | None = None, count: int = 1, timeout_s: float = 10) -> list:
    """The wire log's `type_` messages once there are `count` of them.

    Playwright delivers WebSocket events to Python only while Python waits on it, so a message the page
    has already handled may not be in the log yet: wait on the page's clock rather than assume.
    """
    deadline = time.monotonic() + timeout_s
    while len(found := page.wire.messages(type_, ctx)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} {type_} messages on the wire"
        page.wait_for_timeout(50)
    return found


def wait_error(page: Any, code: str, timeout_s: float = 20) -> dict[str, Any]:
    """The first `error` with `code` on the wire, once the page has shown it."""
    deadline = time.monotonic() + timeout_s
    while not (found := [m for m in page.wire.messages("error") if m["code"] == code]):
        seen = [m["code"] for m in page.wire.messages("error")]
        assert time.monotonic() < deadline, f"no {code} error from the server (saw {seen})"
        page.wait_for_timeout(50)
    page.wait_for_function("code => window.__ttsDemo.errors.some(e => e.code === code)", arg=code)
    return found[0]


def stats(page: Any) -> dict[str, Any]:
    return page.evaluate("window.__ttsDemo.stats()")


def choose_output(page: Any, fmt: str, rate: int | None = None) -> None:
    page.select_option("#format", fmt)
    if rate is not None:
        page.select_option("#rate", str(rate))


def last_turn(page: Any) -> str:
    turns = stats(page)["turns"]
    assert turns, "no turn was started"
    return list(turns)[-1]


def wait_turn(page: Any, ctx: str, status: str, timeout_s: float = 60) -> None:
    page.wait_for_function(
        "([ctx, status]) => window.__ttsDemo.stats().turns[ctx]?.status === status",
        arg=[ctx, status],
        timeout=timeout_s * 1000,
    )


def wait_played_out(page: Any, ctx: str, timeout_s: float = 60) -> dict[str, Any]:
    """Until the worklet has played everything decoded for ctx; returns its counters."""
    page.wait_for_function(
        """ctx => { const c = window.__ttsDemo.stats().contexts[ctx];
                    return c && c.finished && c.samplesDecoded > 0; }""",
        arg=ctx,
        timeout=timeout_s * 1000,
    )
    return stats(page)["contexts"][ctx]


def assert_clean(page: Any, allow: tuple[str, ...] = ()) -> None:
    problems = [p for p in page.problems if not any(a in p for a in allow)]
    assert not problems, problems


def speak(page: Any, text: str) -> str:
    page.fill("#text", text)
    page.click("#go")
    page.wait_for_function("Object.keys(window.__ttsDemo.stats().turns).length > 0")
    return last_turn(page)


# ---- tests


def test_connects_and_shows_capabilities(page: Any, screenshot: Any) -> None:
    hello = page.wire.messages("hello")[0]
    assert page.inner_text("#status-text") == "Ready"
    caps = page.inner_text("#caps")
    assert hello["model"]["name"] in caps
    assert hello["session_id"] in caps
    voices = page.eval_on_selector_all("#voice option", "options => options.map(o => o.value)")
    assert voices == hello["voices"]
    formats = page.eval_on_selector_all("#format option:not([disabled])", "options => options.map(o => o.value)")
    assert {"opus", "pcm_s16le"} <= set(formats)
    rates = page.eval_on_selector_all("#rate option", "options => options.map(o => o.value)")
    assert [int(r) for r in rates if r != "custom"] == hello["sample_rates"]
    screenshot(page, "ready")
    # The same page on a phone, and in the dark colour scheme.
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "phone")
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 1280, "height": 900})
    screenshot(page, "dark")
    assert_clean(page)


def test_speaks_typed_text_with_opus(page: Any, screenshot: Any) -> None:
    choose_output(page, "opus", 48000)
    ctx = speak(page, TEXT)
    wait_turn(page, ctx, "done")
    counts = wait_played_out(page, ctx)
    wire_messages(page, "context.done", ctx)  # every frame of ctx precedes it on the wire
    frames = page.wire.frames(ctx)
    sent = sent_samples(frames, "opus")
    assert sent > 0
    assert counts["framesDecoded"] == len([f for f in frames if f.kind == 1])
    # Chromium's Opus decoder honours the OpusHead pre-skip, so exactly that much less comes out.
    assert counts["samplesDecoded"] == sent - opus_pre_skip(frames)
    assert counts["seqGaps"] == 0 and counts["lateFrames"] == 0
    assert page.inner_text("#fig-ttfa") != "—"
    assert page.wire.messages("segment.started", ctx)[-1]["text"].strip() in page.inner_text("#caption")
    screenshot(page, "done")
    assert_clean(page)


@pytest.mark.parametrize(("fmt", "rate"), [("pcm_s16le", 24000), ("pcm_f32le", 16000)])
def test_speaks_pcm_through_the_worklet(page: Any, screenshot: Any, fmt: str, rate: int) -> None:
    choose_output(page, fmt, rate)
    ctx = speak(page, TEXT)
    wait_turn(page, ctx, "done")
    counts = wait_played_out(page, ctx)
    wire_messages(page, "context.done", ctx)  # every frame of ctx precedes it on the wire
    frames = page.wire.frames(ctx)
    created = page.wire.messages("context.created", ctx)[0]
    assert created["output"]["format"] == fmt and created["output"]["sample_rate"] == rate
    sent = sent_samples(frames, fmt)
    assert sent > 0
    assert counts["samplesDecoded"] == sent
    assert counts["decodedRate"] == rate
    # Every sample was played (resampled to the 48 kHz AudioContext in the worklet).
    assert counts["samplesPlayed"] >= sent - 1
    screenshot(page, "done")
    assert_clean(page)


def test_streams_text_token_by_token(page: Any, screenshot: Any) -> None:
    page.click("[data-mode=stream]")
    page.fill("#token-rate", "40")
    choose_output(page, "opus", 48000)
    page.fill("#text", PARAGRAPH)
    page.click("#go")
    page.wait_for_function("document.querySelector('#token-progress').textContent.includes('tokens sent')")
    screenshot(page, "streaming")
    ctx = last_turn(page)
    wait_turn(page, ctx, "done", timeout_s=90)
    counts = wait_played_out(page, ctx)
    wire_messages(page, "context.done", ctx)  # every frame of ctx precedes it on the wire
    appends = [m for m in page.wire.sent if m["type"] == "text.append" and m["ctx"] == ctx]
    assert len(appends) > 10, "the paragraph should go out in many small pieces"
    assert "".join(m["text"] for m in appends) == PARAGRAPH
    assert any(m["type"] == "context.end" and m["ctx"] == ctx for m in page.wire.sent)
    frames = page.wire.frames(ctx)
    assert counts["samplesDecoded"] == sent_samples(frames, "opus") - opus_pre_skip(frames) > 0
    screenshot(page, "done")
    assert_clean(page)


@pytest.mark.parametrize("server", [{"max_patches": 40}], indirect=True, ids=["long-segments"])
def test_cancel_stops_playback_and_decoding(page: Any, screenshot: Any) -> None:
    choose_output(page, "opus", 48000)
    ctx = speak(page, LONG_TEXT)
    page.wait_for_function("ctx => window.__ttsDemo.stats().contexts[ctx]?.samplesPlayed > 0", arg=ctx, timeout=60_000)
    page.click("#cancel")
    wait_turn(page, ctx, "cancelled")
    cancelled = wire_messages(page, "context.cancelled", ctx)[0]
    assert cancelled["last_seq"] >= 0 and not page.wire.messages("context.done", ctx), "the turn ended before Cancel"
    # The worklet reports `playing: null` once the stream has left it (after the 8 ms fade-out): the count is final.
    page.wait_for_function("() => window.__ttsDemo.stats().playing === null", timeout=10_000)
    before = stats(page)["contexts"][ctx]
    time.sleep(1.0)
    after = stats(page)["contexts"][ctx]

    assert after["cancelled"]
    assert after["framesDecodedAfterCancel"] == 0
    assert after["samplesPlayed"] == before["samplesPlayed"], "playback went on after Cancel"
    assert after["outputSamplesAfterCancel"] <= FADE_SAMPLES
    assert stats(page)["playing"] is None
    # The server's fence, as seen on the wire: nothing of ctx after context.cancelled, none past last_seq.
    assert page.wire.frames_after(cancelled, ctx) == []
    assert all(f.seq <= cancelled["last_seq"] for f in page.wire.frames(ctx) if f.kind == 1)
    # The page decoded no more than the server sent before its ack.
    assert after["framesDecoded"] <= cancelled["last_seq"] + 1
    assert page.get_attribute("#ctx-state", "data-state") == "cancelled"
    screenshot(page, "cancelled")
    assert_clean(page)


def test_shows_server_errors_in_words(page: Any, screenshot: Any) -> None:
    limit = page.wire.messages("hello")[0]["limits"]["max_text_chars"]
    page.fill("#text", "word " * (limit // 5 + 1))
    assert "over" in page.get_attribute("#char-count", "class")
    page.click("#go")
    error = wait_error(page, "text_too_long")
    assert page.is_visible("#banner")
    assert page.inner_text("#banner-title") == "Text is too long"
    assert error["message"] in page.inner_text("#banner-detail")
    screenshot(page, "text-too-long")

    page.click("#banner-close")
    page.select_option("#rate", "custom")
    page.fill("#rate-custom", "12345")
    page.fill("#text", TEXT)
    page.click("#go")
    error = wait_error(page, "bad_format")
    assert page.inner_text("#banner-title") == "Unsupported audio format or sample rate"
    assert error["message"] in page.inner_text("#banner-detail")
    assert page.inner_text("#status-text") == "Ready", "a bad message must not cost the session"
    screenshot(page, "bad-sample-rate")
    assert_clean(page)


def test_shows_busy_when_the_server_is_full(
    browser_context: Any, server_loop: Any, serve: Any, screenshot: Any
) -> None:
    with running(server_loop, serve, max_connections=1) as server:
        first = browser_context.new_page()
        first.goto(f"{server.base_url}/")
        first.wait_for_function("window.__ttsDemo?.status === 'ready'", timeout=20_000)
        second = browser_context.new_page()
        second.goto(f"{server.base_url}/")
        second.wait_for_function("window.__ttsDemo?.status === 'busy'", timeout=20_000)
        assert "busy" in second.inner_text("#status-text").lower()
        assert second.is_disabled("#go")
        screenshot(second, "busy")
        # The seat frees up: the waiting page gets in by itself (after the server's Retry-After).
        first.close()
        second.wait_for_function("window.__ttsDemo.status === 'ready'", timeout=30_000)
        second.close()
