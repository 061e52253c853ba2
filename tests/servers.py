"""Real servers around the real engine, for the end-to-end and browser tests (fixtures in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
