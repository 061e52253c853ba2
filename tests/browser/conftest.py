"""Fixtures for the browser tests: a real server, Debian's Chromium driven by Playwright, and a wire log.

The wire log records what really crossed the WebSocket (Playwright sees the frames in the browser's
network stack), so a test can compare what the server sent with what the page says it decoded
without trusting the page's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
SERVER_START_TIMEOUT_S = 60.0

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # The page plays audio without a click in some tests (reconnects); headless has no user anyway.
    "--autoplay-policy=no-user-gesture-required",
    # A microphone without a person: the permission prompt is answered yes, and the device plays a test beep.
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]

HEADER = struct.Struct("<BBHIQHH")  # protocol page, "Binary frames": 20 bytes, little-endian


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # In CI the browser tests must run: a missing Chromium is a broken install, so they fail there instead.
    if CHROMIUM.exists() or os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason=f"{CHROMIUM} is missing: `apt-get install chromium` (scripts/setup.sh --test does)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


# ---- the server: the e2e suite's in-process server on the tiny checkpoint, run on a thread of its own


@pytest.fixture(scope="session")
def server_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop on a background thread for the servers; Playwright's sync API owns the main thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="browser-test-server", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


@dataclass
class Server:
    base_url: str


@contextlib.contextmanager
def running(loop: asyncio.AbstractEventLoop, serve_factory: Any, **overrides: Any) -> Iterator[Server]:
    """Enter the shared `serve(**overrides)` fixture on `loop`; on exit it also checks that the engine went idle."""
    manager = serve_factory(**overrides)
    started = asyncio.run_coroutine_threadsafe(manager.__aenter__(), loop).result(SERVER_START_TIMEOUT_S)
    try:
        yield Server(started.http_url)
    finally:
        asyncio.run_coroutine_threadsafe(manager.__aexit__(None, None, None), loop).result(SERVER_START_TIMEOUT_S)


@pytest.fixture
def server(request: pytest.FixtureRequest, server_loop: asyncio.AbstractEventLoop) -> Iterator[Server]:
    """A fresh server per test (indirect parameters are `serve` overrides).

    TTSWS_URL=http://host:port runs the tests against a server you started yourself instead.
    """
    url = os.environ.get("TTSWS_URL")
    if url:
        yield Server(url.rstrip("/"))
        return
    with running(server_loop, request.getfixturevalue("serve"), **getattr(request, "param", {})) as started:
        yield started


# ---- the browser


@pytest.fixture(scope="session")
def browser_context(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's Chromium with a fresh profile; never a downloaded browser."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path_factory.getbasetemp())
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


@dataclass
class Frame:
    version: int
    kind: int
    handle: int
    seq: int
    pts: int
    segment: int
    flags: int
    payload: bytes


@dataclass
class WireLog:
    """Every WebSocket message of one page, as the browser saw it, in order."""

    received: list[dict[str, Any] | Frame] = field(default_factory=list)
    sent: list[dict[str, Any]] = field(default_factory=list)

    def on_received(self, payload: str | bytes) -> None:
        if isinstance(payload, bytes):
            self.received.append(Frame(*HEADER.unpack_from(payload), payload=payload[HEADER.size :]))
        else:
            self.received.append(json.loads(payload))

    def messages(self, type_: str, ctx: str | None = None) -> list[dict[str, Any]]:
        return [
            m
            for m in self.received
            if isinstance(m, dict) and m.get("type") == type_ and (ctx is None or m.get("ctx") == ctx)
        ]

    def frames(self, ctx: str) -> list[Frame]:
        """Binary frames of `ctx`: those with its handle from its `context.created` until it is done or cancelled.

        Handles may be reused once a context is over, so the search stops at its terminal message.
        """
        created = self.messages("context.created", ctx)
        assert created, f"no context.created for {ctx}"
        handle = created[0]["handle"]
        out = []
        for item in self.received[self.received.index(created[0]) :]:
            if isinstance(item, Frame) and item.handle == handle:
                out.append(item)
            elif isinstance(item, dict) and item.get("ctx") == ctx and item.get("type") in _TERMINAL:
                break
        return out

    def frames_after(self, message: dict[str, Any], ctx: str) -> list[Frame]:
        """Audio frames with ctx's handle that arrived after `message`."""
        handle = self.messages("context.created", ctx)[0]["handle"]
        start = self.received.index(message)
        return [f for f in self.received[start:] if isinstance(f, Frame) and f.handle == handle and f.kind == 1]


_TERMINAL = ("context.done", "context.cancelled")


def open_demo(browser_context: Any, url: str) -> Any:
    """A fresh tab on the demo at `url`; `tab.wire` is its WireLog, `tab.problems` its JS errors."""
    tab = browser_context.new_page()
    wire = WireLog()
    problems: list[str] = []

    def on_socket(ws: Any) -> None:
        if ws.url.split("?")[0].endswith("/v1/tts/ws"):
            ws.on("framereceived", wire.on_received)
            ws.on("framesent", lambda payload: wire.sent.append(json.loads(payload)))

    tab.on("websocket", on_socket)
    tab.on("pageerror", lambda error: problems.append(f"pageerror: {error}"))
    tab.on("console", lambda msg: problems.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    tab.wire = wire
    tab.problems = problems
    tab.goto(url)
    return tab


@pytest.fixture
def page(browser_context: Any, server: Server) -> Iterator[Any]:
    """A fresh tab with the demo loaded and connected (see `open_demo`)."""
    tab = open_demo(browser_context, f"{server.base_url}/")
    tab.wait_for_function("window.__ttsDemo?.status === 'ready'", timeout=20_000)
    yield tab
    tab.close()


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Any:
    """`screenshot(page, "name")` saves artifacts/screenshots/<test>-<name>.png (full page)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(tab: Any, name: str) -> Path:
        path = SCREENSHOTS / f"{request.node.name}-{name}.png".replace("[", "-").replace("]", "")
        tab.screenshot(path=str(path), full_page=True)
        return path

    return take
