"""The asyncio face of the engine (docs/engine.md): the step loop (engine.engine_loop) on a thread of this process.

Threads and ownership:
- The engine thread runs the EngineLoop, which owns the EngineCore. Everything else reaches it through commands.
- The event loop owns each request's stream (engine.streams). The engine thread hands a step's items over with ONE
  `loop.call_soon_threadsafe` (each is a self-pipe write and a loop wakeup: one per chunk would be hundreds per step at
  high concurrency), and the loop puts them into their streams in the engine's order. Nothing here ever blocks the
  loop for longer than a lock hand-off.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.engine_loop import Abort, Add, Command, Encode, EngineLoop, Item, LoadLoRA, Pause, Resume, UnloadLoRA
from engine.outputs import EngineError, EngineStats, ModelInfo
from engine.params import GenerationRequest
from engine.streams import EngineHandle, RequestStream


class _LoopChannel:
    """Requests consumed on one event loop: the engine thread's deliveries become one loop callback per step."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.streams: dict[str, RequestStream] = {}  # event loop only

    def deliver(self, items: list[tuple[str, Item]]) -> bool:
        try:
            self.loop.call_soon_threadsafe(self._put_all, items)
        except RuntimeError:  # the consumers' event loop is closed: nobody will read these requests
            return False
        return True

    def _put_all(self, items: list[tuple[str, Item]]) -> None:
        for request_id, item in items:
            stream = self.streams.get(request_id)
            if stream is not None:
                stream.put(item)


class AsyncEngine(EngineHandle):
    def __init__(self, config: EngineConfig, core: EngineCore | None = None) -> None:
        self.config = config
        self.core = core or EngineCore(config)  # loads the weights: blocking
        self.info: ModelInfo = self.core.info
        self.max_buffered = config.max_buffered_chunks
        self.loop = EngineLoop(self.core)
        self._channels: dict[asyncio.AbstractEventLoop, _LoopChannel] = {}
        self._thread: threading.Thread | None = None

    # lifecycle

    async def start(self) -> None:
        """Start the engine thread; returns once it has warmed up (one short generation) and serves."""
        if self._thread is not None:
            return
        warm: concurrent.futures.Future[None] = concurrent.futures.Future()

        def on_ready(error: BaseException | None) -> None:
            if warm.set_running_or_notify_cancel():  # False: start() was cancelled, nobody waits
                warm.set_result(None) if error is None else warm.set_exception(error)

        self._thread = threading.Thread(target=self.loop.run, args=(on_ready,), name="engine", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(warm)

    async def close(self) -> None:
        """Fail every open request with EngineError("engine closed") and stop the engine thread."""
        self.loop.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        else:
            self.loop.shut_down(EngineError("engine closed"))

    # requests

    def _channel(self) -> _LoopChannel:
        loop = asyncio.get_running_loop()
        if loop not in self._channels:
            self._channels[loop] = _LoopChannel(loop)
        return self._channels[loop]

    def _open(self, request: GenerationRequest, stream: RequestStream) -> None:
        seq = self.core.make_sequence(request)  # EngineError for a bad request: nothing is queued
        channel = self._channel()
        channel.streams[request.request_id] = stream
        try:
            self.loop.submit(Add(seq, channel))
        except EngineError:
            del channel.streams[request.request_id]
            raise

    def _close(self, request_id: str) -> None:
        self._channel().streams.pop(request_id, None)

    def _flow(self, request_id: str, pause: bool) -> None:
        self.loop.submit(Pause(request_id) if pause else Resume(request_id))

    def cancel(self, request_id: str) -> None:
        """Thread-safe and idempotent: the request leaves the batch at the next step boundary."""
        with contextlib.suppress(EngineError):  # the engine is gone, and every request with it
            self.loop.submit(Abort(request_id))

    async def check(self, request: GenerationRequest) -> None:
        self.core.make_sequence(request)

    async def encode_audio(self, wav: np.ndarray, padding: str = "left") -> np.ndarray:
        """wav (float32 mono at info.encoder_sample_rate) -> latent patches [n, P, D], on the engine thread."""
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()

        def reply(result: np.ndarray | EngineError) -> None:
            if future.set_running_or_notify_cancel():  # False: the caller stopped waiting
                future.set_exception(result) if isinstance(result, EngineError) else future.set_result(result)

        self.loop.submit(Encode(wav, padding, reply))
        return await asyncio.wrap_future(future)

    async def _command(self, make: Callable[[Callable[[EngineError | None], None]], Command]) -> None:
        """Submit a command that replies None or an EngineError, and wait for the reply."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()

        def reply(error: EngineError | None) -> None:
            if future.set_running_or_notify_cancel():
                future.set_result(None) if error is None else future.set_exception(error)

        self.loop.submit(make(reply))
        await asyncio.wrap_future(future)

    async def load_lora(self, name: str, directory: str | Path) -> None:
        """Read and check the adapter in `directory` (off the engine thread), then make it resident as `name`."""
        adapter = await asyncio.to_thread(self.core.read_lora, directory)
        await self._command(lambda reply: LoadLoRA(name, adapter, reply))

    async def unload_lora(self, name: str) -> None:
        """EngineError if unknown or still used by a request."""
        await self._command(lambda reply: UnloadLoRA(name, reply))

    def stats(self) -> EngineStats:
        return self.loop.stats()
