"""The consumer's side of a request, shared by every way of reaching an engine (a thread beside this event loop, or an
engine process): the stream a request's items arrive in, its back-pressure, and `generate()` over it.

Everything here runs on the consumer's event loop. A stream counts the items it holds; when its consumer lags
`max_buffered` items behind it asks the engine to pause the request, and once the consumer has read half of them to
resume it. The engine may have made a step or two more meanwhile, so a stream holds at most a few items beyond.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from engine.outputs import AudioChunk, EngineError, EngineStats, ModelInfo
from engine.params import GenerationRequest

# What reaches a request's stream: a chunk, None (cancelled), or the error that ends it.
Item = AudioChunk | EngineError | None


class RequestStream:
    def __init__(self, request_id: str, max_buffered: int, flow: Callable[[str, bool], None]) -> None:
        """`flow(request_id, paused)` asks the engine to pause (True) or resume (False) the request."""
        self.request_id = request_id
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.max_buffered = max_buffered
        self.flow = flow
        self.paused = False

    def put(self, item: Item) -> None:
        self.queue.put_nowait(item)
        if not self.paused and self.queue.qsize() >= self.max_buffered and isinstance(item, AudioChunk):
            self.paused = True
            self._ask(True)

    async def get(self) -> Item:
        item = await self.queue.get()
        if self.paused and self.queue.qsize() <= self.max_buffered // 2:
            self.paused = False
            if isinstance(item, AudioChunk) and item.finish_reason is None:
                self._ask(False)
        return item

    def _ask(self, pause: bool) -> None:
        with contextlib.suppress(EngineError):  # the engine is gone: its error is on the way
            self.flow(self.request_id, pause)


class EngineHandle(abc.ABC):
    """What a consumer holds: `generate()`, `cancel()`, `encode_audio()`, `check()`, `stats()`, `info`."""

    info: ModelInfo
    max_buffered: int

    async def generate(self, request: GenerationRequest) -> AsyncIterator[AudioChunk]:
        """Stream a request's chunks; the last one has `finish_reason` set.

        Raises EngineError for a bad request or when the engine fails. Leaving the loop early, or cancelling the
        consuming task, cancels the request.
        """
        stream = RequestStream(request.request_id, self.max_buffered, self._flow)
        self._open(request, stream)
        done = False
        try:
            while not done:
                item = await stream.get()
                if item is None:  # cancelled through cancel()
                    done = True
                    return
                if isinstance(item, EngineError):
                    done = True
                    raise item
                done = item.finish_reason is not None
                yield item
        finally:
            self._close(request.request_id)
            if not done:
                self.cancel(request.request_id)

    @abc.abstractmethod
    def _open(self, request: GenerationRequest, stream: RequestStream) -> None:
        """Send the request to the engine, whose items are to reach `stream` (EngineError if it cannot)."""

    def _close(self, request_id: str) -> None:  # noqa: B027 (a hook: nothing to forget by default)
        """The consumer is done with the request's stream."""

    @abc.abstractmethod
    def _flow(self, request_id: str, pause: bool) -> None:
        """Ask the engine to pause or resume a request (EngineError if the engine is gone)."""

    @abc.abstractmethod
    def cancel(self, request_id: str) -> None:
        """Idempotent: the request leaves the batch at the next step boundary."""

    @abc.abstractmethod
    async def encode_audio(self, wav, padding: str = "left"):  # type: ignore[no-untyped-def]
        """wav (float32 mono at info.encoder_sample_rate) -> latent patches [n, P, D]."""

    @abc.abstractmethod
    async def check(self, request: GenerationRequest) -> None:
        """Raise EngineError if `request` could never run, without queueing anything."""

    @abc.abstractmethod
    async def load_lora(self, name: str, directory: str | Path) -> None:
        """Make the LoRA adapter in `directory` (a local copy in the released layout) resident as `name`; EngineError
        if it does not fit this engine or its limits."""

    @abc.abstractmethod
    async def unload_lora(self, name: str) -> None:
        """EngineError if `name` is not resident or a request still uses it."""

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...
