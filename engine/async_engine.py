"""The asyncio face of the engine (docs/engine.md): EngineCore.step() on its own thread, one stream per request.

Threads and ownership:
- The engine thread owns the EngineCore and the table of open streams. Everything else reaches them
  through `_submit()`: a command list under a condition variable, drained at every step boundary.
- The event loop owns each request's asyncio.Queue. The engine thread hands a step's items over with ONE
  `loop.call_soon_threadsafe` (each is a self-pipe write and a loop wakeup: one per chunk would be hundreds per step
  at high concurrency), and the loop puts them into their queues in the engine's order. Nothing here ever blocks
  the loop for longer than a lock hand-off.
- Back-pressure: a stream counts the chunks handed to the loop and not yet read. The engine thread pauses
  the request, before its next step, when that count reaches `max_buffered_chunks`; the consumer resumes
  it once it has read half of them. A paused request keeps its KV blocks and slot.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.outputs import AudioChunk, EngineError, EngineStats, ModelInfo
from engine.params import GenerationParams, GenerationRequest
from engine.sequence import Sequence

logger = logging.getLogger(__name__)

# What the engine thread hands to a request's queue: a chunk, None (cancelled), or the error that ends it.
_Item = AudioChunk | EngineError | None


class _Stream:
    """One request's output channel from the engine thread to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_buffered: int) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.max_buffered = max_buffered
        self.lock = threading.Lock()  # guards the two counters below, shared by both threads
        self.buffered = 0  # items handed to the loop and not yet taken by the consumer
        self.paused = False

    def count(self) -> bool:
        """Engine thread, for each item it hands over. True when the request must be paused now (its consumer lags
        too far)."""
        with self.lock:
            self.buffered += 1
            pause = not self.paused and self.buffered >= self.max_buffered
            self.paused |= pause
        return pause

    def taken(self) -> bool:
        """Event loop, after each get. True when a paused request may resume."""
        with self.lock:
            self.buffered -= 1
            resume = self.paused and self.buffered <= self.max_buffered // 2
            self.paused &= not resume
        return resume


# One item on its way to a request's queue: (request id, its stream, the item).
_Delivery = tuple[str, _Stream, _Item]


def _put_all(deliveries: list[_Delivery]) -> None:
    """Event loop: one hand-off from the engine thread, queued in the engine's order."""
    for _, stream, item in deliveries:
        stream.queue.put_nowait(item)


class AsyncEngine:
    def __init__(self, config: EngineConfig, core: EngineCore | None = None) -> None:
        self.config = config
        self.core = core or EngineCore(config)  # loads the weights: blocking
        self.info: ModelInfo = self.core.info
        self._cond = threading.Condition()
        self._commands: list[tuple[Any, ...]] = []  # guarded by _cond
        self._stopping = False  # guarded by _cond
        self._dead = False  # guarded by _cond: the engine thread has exited, commands are refused
        self._last_add = 0.0  # guarded by _cond: time.monotonic() of the newest "add" command
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._stats: EngineStats = self.core.stats()  # replaced (never mutated) by the engine thread
        self._thread: threading.Thread | None = None

    # lifecycle

    async def start(self) -> None:
        """Start the engine thread; returns once it has warmed up (one short generation) and serves."""
        if self._thread is not None:
            return
        warm: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._loop, args=(warm,), name="engine", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(warm)

    def _warm_up(self) -> None:
        request = GenerationRequest(text="Warm up.", params=GenerationParams(seed=0, max_patches=2))
        self.core.add_request(request)
        while self.core.has_work():
            self.core.step()
        self._stats = self.core.stats()

    async def close(self) -> None:
        """Fail every open request with EngineError("engine closed") and stop the engine thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        else:
            self._shut_down(EngineError("engine closed"))

    # requests

    async def generate(self, request: GenerationRequest) -> AsyncIterator[AudioChunk]:
        """Stream a request's chunks; the last one has `finish_reason` set.

        Raises EngineError for a bad request (nothing is queued then) or when the engine fails. Leaving
        the loop early, or cancelling the consuming task, cancels the request.
        """
        seq = self.core.make_sequence(request)
        stream = _Stream(asyncio.get_running_loop(), self.config.max_buffered_chunks)
        self._submit(("add", seq, stream))
        done = False
        try:
            while not done:
                item = await stream.queue.get()
                if stream.taken() and isinstance(item, AudioChunk) and item.finish_reason is None:
                    with contextlib.suppress(EngineError):  # the engine is gone: its error is on the way
                        self._submit(("resume", request.request_id))
                if item is None:  # cancelled through cancel()
                    done = True
                    return
                if isinstance(item, EngineError):
                    done = True
                    raise item
                done = item.finish_reason is not None
                yield item
        finally:
            if not done:
                self.cancel(request.request_id)

    def check(self, request: GenerationRequest) -> None:
        """Raise EngineError if `request` could never run (as generate() would), without queueing anything."""
        self.core.make_sequence(request)

    def cancel(self, request_id: str) -> None:
        """Thread-safe and idempotent: the request leaves the batch at the next step boundary."""
        with contextlib.suppress(EngineError):  # the engine is gone, and every request with it
            self._submit(("abort", request_id))

    async def encode_audio(self, wav: np.ndarray, padding: str = "left") -> np.ndarray:
        """wav (float32 mono at info.encoder_sample_rate) -> latent patches [n, P, D], on the engine thread."""
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        self._submit(("encode", wav, padding, future))
        return await asyncio.wrap_future(future)

    def stats(self) -> EngineStats:
        return self._stats

    # engine thread

    def _submit(self, command: tuple[Any, ...]) -> None:
        with self._cond:
            if self._dead or self._stopping:
                raise EngineError("the engine is not running")
            self._commands.append(command)
            if command[0] == "add":
                self._last_add = time.monotonic()
            self._cond.notify()

    def _loop(self, warm: concurrent.futures.Future[None]) -> None:
        error = EngineError("engine closed")
        try:
            # Warm up on this thread: per-thread caches (cuBLAS handles, cuDNN plans) must be warm where steps run.
            self._warm_up()
            if warm.set_running_or_notify_cancel():  # False: start() was cancelled, nobody waits
                warm.set_result(None)
            while self._wait_for_work():
                self._run_commands()
                if self.core.has_work():
                    self._deliver(self.core.step())
                self._stats = self.core.stats()
        except EngineError as exc:
            logger.exception("engine failed")
            error = exc
        except BaseException as exc:
            logger.exception("engine loop crashed")
            error = EngineError(f"engine loop crashed: {exc!r}")
        if not warm.done() and warm.set_running_or_notify_cancel():  # failed while warming up
            warm.set_exception(error)
        self._shut_down(error)

    def _wait_for_work(self) -> bool:
        """Block while idle. After idling, an arrival waits for the rest of its burst (until `coalesce_ms` pass
        without another, at most `coalesce_max_ms`) so that the burst lands in one prefill; a burst enters at the
        pace its senders tokenize, and a fixed window would cut it. While busy, arrivals join at the next step
        boundary. False: stop."""
        with self._cond:
            if self.core.has_work():
                return not self._stopping
            while not self._commands and not self._stopping:
                self._cond.wait()
            if any(command[0] == "add" for command in self._commands):
                cap = time.monotonic() + self.config.coalesce_max_ms / 1e3
                while not self._stopping:
                    deadline = min(self._last_add + self.config.coalesce_ms / 1e3, cap)
                    if (remaining := deadline - time.monotonic()) <= 0:
                        break
                    self._cond.wait(remaining)
            return not self._stopping

    def _run_commands(self) -> None:
        with self._cond:
            commands, self._commands = self._commands, []
        endings: list[_Delivery] = []  # requests these commands end, handed over together
        for kind, *args in commands:
            if kind == "add":
                seq, stream = args
                if (error := self._add(seq, stream)) is not None:
                    endings.append((seq.request_id, stream, error))
            elif kind == "abort":
                (request_id,) = args
                self.core.abort(request_id)
                stream = self._streams.pop(request_id, None)
                if stream is not None:
                    endings.append((request_id, stream, None))
            elif kind == "resume":
                self.core.resume(*args)
            elif kind == "encode":
                wav, padding, future = args
                if not future.set_running_or_notify_cancel():  # the caller stopped waiting
                    continue
                try:
                    future.set_result(self.core.encode_audio(wav, padding))
                except Exception as exc:
                    future.set_exception(exc)
        self._hand_off(endings)

    def _add(self, seq: Sequence, stream: _Stream) -> EngineError | None:
        """Open the request's stream; the error that ends it at once if the engine refuses it."""
        if seq.request_id in self._streams:
            return EngineError(f"request id {seq.request_id!r} is already in use")
        try:
            self.core.add_sequence(seq)
        except EngineError as exc:
            return exc
        self._streams[seq.request_id] = stream
        return None

    def _deliver(self, chunks: list[AudioChunk]) -> None:
        deliveries: list[_Delivery] = []
        for chunk in chunks:
            stream = self._streams.get(chunk.request_id)
            if stream is None:
                continue
            if chunk.finish_reason is not None:
                del self._streams[chunk.request_id]
            deliveries.append((chunk.request_id, stream, chunk))
        self._hand_off(deliveries)

    def _hand_off(self, deliveries: list[_Delivery]) -> None:
        """Engine thread: one call_soon_threadsafe per event loop for all of `deliveries`, then pause the requests
        whose consumers lag (before the next step, which is all the pause needs)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Delivery]] = {}
        for delivery in deliveries:
            by_loop.setdefault(delivery[1].loop, []).append(delivery)
        for loop, batch in by_loop.items():
            pauses = [stream.count() for _, stream, _ in batch]
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # the consumers' event loop is closed: nobody will read these requests
                for request_id, _, _ in batch:
                    self.core.abort(request_id)
                    self._streams.pop(request_id, None)
                continue
            for (request_id, _, item), pause in zip(batch, pauses, strict=True):
                if pause and isinstance(item, AudioChunk) and item.finish_reason is None:
                    self.core.pause(request_id)

    def _shut_down(self, error: EngineError) -> None:
        """Refuse new commands, fail queued ones and every open request with `error`."""
        with self._cond:
            self._dead = True
            commands, self._commands = self._commands, []
        # Unhealthy before anyone hears of the failure, so that a failed request sees a consistent stats().
        self._stats = dataclasses.replace(self.core.stats(), healthy=False)
        endings: list[_Delivery] = []
        for kind, *args in commands:
            if kind == "add":
                endings.append((args[0].request_id, args[1], EngineError(str(error))))
            elif kind == "encode" and args[2].set_running_or_notify_cancel():
                args[2].set_exception(EngineError(str(error)))
        endings.extend((request_id, stream, EngineError(str(error))) for request_id, stream in self._streams.items())
        self._streams.clear()
        self._hand_off(endings)
