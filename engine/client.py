"""A worker's handle on an engine process (engine.process): AsyncEngine's interface over a Unix socket.

The engine's messages are handled as they arrive (engine.ipc.Receiver): each step's items go into their requests'
streams in order. Commands are written to the socket as they are made (a buffered write, never awaited: cancel()
must not block). If the engine process goes away, every open request and call fails with EngineError and
`stats().healthy` turns False; nothing waits forever. `on_lost` callbacks run as soon as the connection is lost, so
that a router can stop sending work there at once instead of at its next health poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine import ipc
from engine.outputs import EngineError, EngineStats, ModelInfo
from engine.params import GenerationRequest
from engine.streams import EngineHandle, RequestStream

logger = logging.getLogger(__name__)


class EngineClient(EngineHandle):
    def __init__(
        self, connection: ipc.Receiver, info: ModelInfo, stats: EngineStats, pid: int, max_buffered: int
    ) -> None:
        self.info, self.max_buffered = info, max_buffered
        self.pid = pid  # the engine process's
        self._connection = connection
        self._stats = stats
        self._streams: dict[str, RequestStream] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._error: EngineError | None = None  # set once the engine is gone
        self._on_lost: list[Callable[[], None]] = []
        connection.hand_to(self._received)
        connection.closed.add_done_callback(self._lost)

    @classmethod
    async def connect(cls, path: str, max_buffered: int = 32) -> EngineClient:
        """Connect to the engine process listening at `path` (EngineError if it cannot be reached)."""
        try:
            connection = await ipc.connect(path)
            kind, info, stats, pid = await connection.first()
        except (OSError, EOFError) as exc:
            raise EngineError(f"cannot reach the engine at {path}: {exc}") from exc
        assert kind == "hello"
        return cls(connection, info, stats, pid, max_buffered)

    async def close(self) -> None:
        """Disconnect: the engine drops this worker's requests; open streams here fail."""
        self._fail(EngineError("the engine connection was closed"))
        self._connection.close()
        await self._connection.closed

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on this event loop) once the engine connection is lost or closed."""
        self._on_lost.append(callback)

    # requests

    def _send(self, message: tuple[Any, ...]) -> None:
        if self._error is not None:
            raise EngineError(str(self._error))
        self._connection.send(message)

    def _open(self, request: GenerationRequest, stream: RequestStream) -> None:
        self._send(("add", request))  # a bad request comes back as its stream's first item: an EngineError
        self._streams[request.request_id] = stream

    def _close(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def _flow(self, request_id: str, pause: bool) -> None:
        self._send(("pause" if pause else "resume", request_id))

    def cancel(self, request_id: str) -> None:
        with contextlib.suppress(EngineError):  # the engine is gone, and every request with it
            self._send(("abort", request_id))

    async def _call(self, kind: str, *args: Any) -> Any:
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._send((kind, call_id, *args))
        self._calls[call_id] = future
        try:
            result = await future
        finally:
            self._calls.pop(call_id, None)
        if isinstance(result, EngineError):
            raise result
        return result

    async def encode_audio(self, wav: np.ndarray, padding: str = "left") -> np.ndarray:
        return await self._call("encode", np.ascontiguousarray(wav, np.float32), padding)

    async def check(self, request: GenerationRequest) -> None:
        await self._call("check", request)

    async def load_lora(self, name: str, directory: str | Path) -> None:
        """The engine process reads the adapter from `directory` (same machine) and makes it resident."""
        await self._call("load_lora", name, str(directory))

    async def unload_lora(self, name: str) -> None:
        await self._call("unload_lora", name)

    def stats(self) -> EngineStats:
        return self._stats

    # the engine's messages

    def _received(self, message: tuple[Any, ...]) -> None:
        kind, *args = message
        if kind == "items":
            items, self._stats = args
            for request_id, item in items:
                if (stream := self._streams.get(request_id)) is not None:
                    stream.put(item)
        elif kind == "reply":
            call_id, result = args
            if (future := self._calls.get(call_id)) is not None and not future.done():
                future.set_result(result)
        elif kind == "stats":
            (self._stats,) = args

    def _lost(self, closed: asyncio.Future[BaseException | None]) -> None:
        if self._error is None:
            logger.error("engine connection lost: %s", closed.result() or "closed by the engine")
            self._fail(EngineError("the engine process is gone"))

    def _fail(self, error: EngineError) -> None:
        if self._error is not None:
            return
        self._error = error
        self._stats = dataclasses.replace(self._stats, healthy=False)
        for stream in self._streams.values():
            stream.put(EngineError(str(error)))
        for future in self._calls.values():
            if not future.done():
                future.set_result(EngineError(str(error)))
        loop = asyncio.get_running_loop()
        for callback in self._on_lost:
            loop.call_soon(callback)
