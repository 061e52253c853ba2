"""The blocking client: the asyncio client on an event loop of its own thread, for code that is not async.

with SyncClient("ws://localhost:8000") as client:
    result = client.synthesize("Hello there.", output={"format": "pcm_s16le", "sample_rate": 24000})
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from wsserver.client.client import Client
from wsserver.client.context import Context, Synthesis
from wsserver.client.events import Audio, Cancelled, Event

T = TypeVar("T")


class SyncClient:
    """`Client`'s API, blocking. Each call runs on the client's own loop; its events reach the caller's thread."""

    def __init__(self, url: str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ttsws-client", daemon=True)
        self._thread.start()
        self._client = self._run(self._make(url, options))

    @staticmethod
    async def _make(url: str, options: dict[str, Any]) -> Client:
        return Client(url, **options)  # its lock and futures belong to the client's loop

    def __enter__(self) -> SyncClient:
        self._run(self._client.connect())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def hello(self) -> dict[str, Any]:
        return self._client.hello

    def context(self, ctx: str | None = None, **settings: Any) -> SyncContext:
        return SyncContext(self, self._run(self._client.context(ctx, **settings)))

    def synthesize(self, text: str, **settings: Any) -> Synthesis:
        return self._run(self._client.synthesize(text, **settings))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


class SyncContext:
    def __init__(self, client: SyncClient, context: Context) -> None:
        self._client, self._context = client, context
        self._events = aiter(context)

    @property
    def id(self) -> str:
        return self._context.id

    @property
    def output(self) -> dict[str, Any]:
        return self._context.output

    def append(self, text: str, *, flush: bool = False) -> None:
        self._client._run(self._context.append(text, flush=flush))

    def flush(self) -> None:
        self._client._run(self._context.flush())

    def end(self) -> None:
        self._client._run(self._context.end())

    def cancel(self) -> Cancelled:
        return self._client._run(self._context.cancel())

    def __iter__(self) -> Iterator[Event]:
        while True:
            try:
                yield self._client._run(_next(self._events))
            except StopAsyncIteration:
                return

    def audio(self) -> Iterator[Audio]:
        for event in self:
            if isinstance(event, Audio):
                yield event

    def collect(self) -> Synthesis:
        return self._client._run(self._context.collect())


async def _next(events: Any) -> Event:
    return await anext(events)
