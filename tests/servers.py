"""Real servers around the real engine, for the end-to-end and browser tests (fixtures in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

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


REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """`python -m wsserver` running as deployed (a supervisor, its engine and worker processes)."""

    process: asyncio.subprocess.Process
    http: str
    ws: str

    async def status(self) -> dict:
        from tests.e2e.client import http_get

        return orjson.loads((await http_get(self.http + "/status"))[2])


@contextlib.asynccontextmanager
async def server_process(checkpoint: Path, *args: str) -> AsyncIterator[ServerProcess]:
    """`python -m wsserver` on the CPU on a free port, once it answers /ready 200; stopped on the way out if still
    running (SIGTERM, then SIGKILL: a supervisor killed outright leaves its children to notice and exit alone)."""
    from tests.e2e.client import http_get

    port = free_port()
    command = ["--model", str(checkpoint), "--device", "cpu", "--port", str(port), *args]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "wsserver", *command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    running = ServerProcess(process, f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/v1/tts/ws")
    try:
        for _ in range(600):
            await asyncio.sleep(0.1)
            with contextlib.suppress(OSError):
                if (await http_get(running.http + "/ready"))[0] == 200:
                    break
        else:
            raise AssertionError(f"the server on port {port} was not ready within 60 s")
        yield running
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    """Wait for what the server's processes settle to asynchronously (an abort reaches the engine after the close
    that caused it; the figures of /status after the worker reports them)."""
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.05)
