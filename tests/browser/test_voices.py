"""The web demo's Voices panel in headless Chromium against a real server on the tiny checkpoint: a voice added
from a file or the microphone, spoken with over the WebSocket and deleted; the server's errors shown in its words;
the page behind an API key and an admin key.

What the page shows is checked against what really crossed the network (Playwright's view of the HTTP responses
and WebSocket frames), not against the page's own bookkeeping.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from tests.servers import running_server
from wsserver.decoding import UploadLimits

from .conftest import open_demo, running
from .test_web_demo import assert_clean, speak, wait_turn, wire_messages

pytestmark = pytest.mark.browser

TRANSCRIPT = "This is Alice speaking."
SHORT_TEXT = "Hello from a new voice."
HTTP_ERRORS = ("Failed to load resource",)  # Chromium logs every 4xx answer to the console


def wav_file(directory: Path, seconds: float = 1.5, name: str = "alice.wav") -> Path:
    rate = 16000
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(buffer, 0.3 * np.sin(2 * np.pi * 220 * t), rate, format="WAV")
    path = directory / name
    path.write_bytes(buffer.getvalue())
    return path


def voices_loaded(page: Any) -> None:
    """Until the panel lists the server's voices (the listing answered and /info gave the limits)."""
    page.wait_for_selector("#voice-list li[data-id='default']", timeout=10_000)
    page.wait_for_function("!document.querySelector('#voice-add').disabled")


def add_voice(page: Any, name: str, transcript: str) -> dict[str, Any]:
    """Fill in the form, press Add voice; returns the server's answer to the upload as it crossed the network."""
    page.fill("#voice-name", name)
    page.fill("#voice-transcript", transcript)
    with page.expect_response(lambda r: r.url.endswith("/v1/voices") and r.request.method == "POST") as answer:
        page.click("#voice-add")
    response = answer.value
    return {"status": response.status, **response.json()}


def voice_status(page: Any) -> str:
    page.wait_for_function("!document.querySelector('#voice-add').disabled")  # the upload has been answered
    return page.inner_text("#voice-status")


def test_voice_from_a_file_speaks_and_is_deleted(page: Any, screenshot: Any, tmp_path: Path) -> None:
    voices_loaded(page)
    info = page.request.get(page.url + "info").json()
    roles = page.eval_on_selector_all("#voice-role option", "options => options.map(o => o.value)")
    assert roles == info["voices"]["roles"] == ["prompt", "reference", "both"]
    uploads = info["voices"]["uploads"]
    assert page.get_attribute("#voice-name", "maxlength") == str(uploads["max_name_chars"])
    assert page.get_attribute("#voice-transcript", "maxlength") == str(uploads["max_transcript_chars"])

    page.set_input_files("#voice-file", wav_file(tmp_path))
    voice = add_voice(page, "Alice", TRANSCRIPT)
    assert voice["status"] == 201 and voice["id"].startswith("vc_") and voice["name"] == "Alice"
    assert f"Added Alice ({voice['id']}" in voice_status(page)
    row = f"#voice-list li[data-id='{voice['id']}']"
    assert "Alice" in page.inner_text(row) and page.get_attribute(row, "aria-current") == "true"
    # It is picked for speaking: the next context.create names it, and its audio arrives.
    assert page.input_value("#voice") == voice["id"]
    assert page.evaluate("window.__ttsDemo.voices") == ["default", voice["id"]]
    screenshot(page, "added")
    ctx = speak(page, SHORT_TEXT)
    wait_turn(page, ctx, "done")
    created = next(m for m in page.wire.sent if m["type"] == "context.create" and m["ctx"] == ctx)
    assert created["voice"] == voice["id"]
    wire_messages(page, "context.done", ctx)
    assert [f for f in page.wire.frames(ctx) if f.kind == 1], "no audio frames for the new voice"

    # Another voice is picked with Use; the new one is deleted (after the confirmation) and disappears.
    page.click("#voice-list li[data-id='default'] [data-action=use]")
    assert page.input_value("#voice") == "default"
    assert page.locator("#voice-list li[data-id='default'] [data-action=delete]").count() == 0  # built in
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_response(lambda r: r.request.method == "DELETE") as answer:
        page.click(f"{row} [data-action=delete]")
    assert answer.value.status == 200
    page.wait_for_selector(row, state="detached")
    assert page.evaluate("window.__ttsDemo.voices") == ["default"]
    assert page.eval_on_selector_all("#voice option", "options => options.map(o => o.value)") == ["default"]
    assert page.request.get(page.url + "v1/voices").json()["data"][-1]["id"] == "default"
    assert_clean(page)


@pytest.mark.parametrize("server", [{"uploads": UploadLimits(max_bytes=60_000)}], indirect=True, ids=["60kB"])
def test_voice_errors_are_shown_in_the_servers_words(page: Any, screenshot: Any, tmp_path: Path) -> None:
    voices_loaded(page)
    assert "58.6 KiB" in page.inner_text("#voice-limits")  # the limits /info announces

    # Refused on the page before anything is sent: no audio, no transcript, more bytes than the server takes.
    page.fill("#voice-name", "Nobody")
    page.click("#voice-add")
    assert voice_status(page) == "Choose an audio file first."
    page.set_input_files("#voice-file", wav_file(tmp_path, seconds=2.0))  # 64 kB
    page.fill("#voice-transcript", TRANSCRIPT)
    page.click("#voice-add")
    assert voice_status(page).startswith("The audio is too big: 62.5 KiB; the server takes at most 58.6 KiB")

    # A file that is no audio at all: the server's answer, in its words.
    page.set_input_files("#voice-file", files=[{"name": "bad.wav", "mimeType": "audio/wav", "buffer": b"RIFF" * 500}])
    answer = add_voice(page, "Broken", TRANSCRIPT)
    assert answer["status"] == 400 and answer["error"]["code"] == "audio_corrupt"
    shown = voice_status(page)
    assert shown.startswith("The file is not audio the server can read.")
    assert answer["error"]["message"] in shown and "HTTP 400 · audio_corrupt" in shown
    assert page.get_attribute("#voice-status", "data-level") == "error"
    assert page.evaluate("window.__ttsDemo.errors.at(-1).code") == "audio_corrupt"
    assert page.evaluate("window.__ttsDemo.voices") == ["default"], "nothing was stored"
    screenshot(page, "corrupt")
    assert_clean(page, allow=HTTP_ERRORS)


@pytest.mark.parametrize("server", [{"uploads": UploadLimits(max_duration_s=1.8)}], indirect=True, ids=["1.8s"])
def test_voice_from_the_microphone(page: Any, screenshot: Any) -> None:
    voices_loaded(page)
    page.click("[data-source=mic]")
    page.click("#voice-record")
    page.wait_for_function("document.querySelector('#voice-record').textContent.includes('Stop')")
    # Nobody presses Stop: the recording ends by itself before the server's longest voice.
    page.wait_for_function(
        "document.querySelector('#voice-record-time').textContent.startsWith('Recorded')", timeout=10_000
    )
    assert "stopped at the server's limit" in page.inner_text("#voice-record-time")
    assert page.is_visible("#voice-preview")
    screenshot(page, "recorded")
    voice = add_voice(page, "Microphone", "Beep. Beep.")
    assert voice["status"] == 201, voice
    assert 1.0 <= voice["duration_s"] <= 1.8
    page.wait_for_selector(f"#voice-list li[data-id='{voice['id']}']")
    assert page.input_value("#voice") == voice["id"]
    assert "Added Microphone" in voice_status(page)
    assert_clean(page)


def test_page_behind_api_and_admin_keys(
    browser_context: Any, server_loop: Any, serve: Any, screenshot: Any, tmp_path: Path
) -> None:
    with running(server_loop, serve, api_key="sekret", admin_key="boss") as server:
        tab = open_demo(browser_context, f"{server.base_url}/")
        tab.wait_for_function("window.__ttsDemo.status === 'offline'", timeout=20_000)
        assert "Not authorised" in tab.inner_text("#status-text")
        assert tab.inner_text("#banner-title") == "Not authorised"
        assert tab.get_attribute("#api-key", "aria-invalid") == "true"
        tab.wait_for_function("document.querySelector('#voice-list').textContent.includes('HTTP 401')")
        assert "enter the server's API key" in tab.inner_text("#voice-list")
        screenshot(tab, "locked")

        # The API key opens the session and the listing: the page speaks.
        tab.fill("#api-key", "sekret")
        tab.click("#api-key-apply")
        tab.wait_for_function("window.__ttsDemo.status === 'ready'", timeout=20_000)
        voices_loaded(tab)
        ctx = speak(tab, SHORT_TEXT)
        wait_turn(tab, ctx, "done")
        assert [f for f in tab.wire.frames(ctx) if f.kind == 1]

        # Adding a voice needs the admin key: refused with the API key, accepted with the admin key.
        tab.set_input_files("#voice-file", wav_file(tmp_path))
        refused = add_voice(tab, "Alice", TRANSCRIPT)
        assert refused["status"] == 401 and refused["error"]["code"] == "unauthorized"
        shown = voice_status(tab)
        assert shown.startswith("Not authorised to change voices") and refused["error"]["message"] in shown
        assert tab.get_attribute("#admin-key", "aria-invalid") == "true"
        tab.fill("#admin-key", "boss")
        tab.click("#api-key-apply")
        voice = add_voice(tab, "Alice", TRANSCRIPT)
        assert voice["status"] == 201
        tab.once("dialog", lambda dialog: dialog.accept())
        with tab.expect_response(lambda r: r.request.method == "DELETE") as answer:
            tab.click(f"#voice-list li[data-id='{voice['id']}'] [data-action=delete]")
        assert answer.value.status == 200

        # The keys stay with the tab: a reload connects at once.
        tab.reload()
        tab.wait_for_function("window.__ttsDemo?.status === 'ready'", timeout=20_000)
        voices_loaded(tab)
        assert tab.input_value("#admin-key") == "boss"
        assert_clean(tab, allow=(*HTTP_ERRORS, "WebSocket connection"))
        tab.close()


def test_roles_follow_the_model(browser_context: Any, server_loop: Any, engine_v1: Any, tmp_path: Path) -> None:
    """VoxCPM-0.5B has no reference audio: the form offers the prompt role only."""
    with running(server_loop, lambda **kw: running_server(engine_v1, voices_store=tmp_path, **kw)) as server:
        tab = open_demo(browser_context, f"{server.base_url}/")
        tab.wait_for_function("window.__ttsDemo?.status === 'ready'", timeout=20_000)
        voices_loaded(tab)
        assert tab.eval_on_selector_all("#voice-role option", "options => options.map(o => o.value)") == ["prompt"]
        assert tab.is_disabled("#voice-role")
        assert_clean(tab)
        tab.close()
