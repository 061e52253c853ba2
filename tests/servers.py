"""Real servers around the real engine, for the end-to-end and browser tests (fixtures in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the GPU machine runs the engine tests without the server's packages (websockets, opuslib)
    from engine import AsyncEngine
    from wsserver.server import TTSServer


@dataclass
class RunningServer:
    server: TTSServer
    ws_url: str
    http_url: str


ServeFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningServer]]


async def wait_idle(engine: AsyncEngine, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.running == stats.waiting == stats.paused == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"engine still busy after the test: {engine.stats()}")


@contextlib.asynccontextmanager
async def running_server(
    engine: AsyncEngine, voices_store: Path, limits: dict[str, Any] | None = None, **overrides: Any
) -> AsyncIterator[RunningServer]:
    """A real server on a loopback port around `engine`; on the way out, the engine must have gone back to idle."""
    from wsserver.config import ServerConfig
    from wsserver.protocol import Limits
    from wsserver.server import TTSServer
    from wsserver.voices import open_voices

    overrides.setdefault("max_patches", 6)
    overrides.setdefault("port", 0)
    config = ServerConfig(model="in-process", voices_store=voices_store, limits=Limits(**(limits or {})), **overrides)
    server = TTSServer(config)
    server.attach([engine], await open_voices(engine, config))
    port = (await server.listen()).getsockname()[1]
    try:
        yield RunningServer(server, f"ws://127.0.0.1:{port}/v1/tts/ws", f"http://127.0.0.1:{port}")
    finally:
        await server.close()
        await wait_idle(engine)
