"""A test client for ttsws/1: records every message and frame in arrival order."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from wsserver.frames import FrameHeader


@dataclass
class Frame:
    header: FrameHeader
    payload: bytes


Event = dict[str, Any] | Frame


@dataclass
class Client:
    ws: ClientConnection
    hello: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    @classmethod
    async def connect(cls, url: str, **kwargs: Any) -> Client:
        client = cls(await connect(url, **kwargs))
        client.hello = await client.next_event()
        assert client.hello["type"] == "hello"
        return client

    async def send(self, type: str, **fields: Any) -> None:
        await self.ws.send(orjson.dumps({"type": type, **fields}).decode())

    async def next_event(self, timeout: float = 30) -> Event:
        data = await asyncio.wait_for(self.ws.recv(), timeout)
        event: Event = orjson.loads(data) if isinstance(data, str) else Frame(*FrameHeader.unpack(data))
        self.events.append(event)
        return event

    async def until(self, predicate: Callable[[Event], bool], timeout: float = 30) -> Event:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = await self.next_event(max(0.01, deadline - loop.time()))
            if predicate(event):
                return event

    async def until_message(self, type: str, ctx: str | None = None, timeout: float = 30) -> dict[str, Any]:
        def match(event: Event) -> bool:
            return isinstance(event, dict) and event["type"] == type and (ctx is None or event.get("ctx") == ctx)

        return _message(await self.until(match, timeout))

    async def until_ended(self, ctx: str, timeout: float = 60) -> dict[str, Any]:
        """The message that ended `ctx`: context.done, context.cancelled or an error for it."""

        def ended(event: Event) -> bool:
            if not isinstance(event, dict) or event.get("ctx") != ctx:
                return False
            return event["type"] in ("context.done", "context.cancelled") or (
                event["type"] == "error" and event["ended"]
            )

        for event in self.events:  # it may have come while waiting for something else
            if ended(event):
                return _message(event)
        return _message(await self.until(ended, timeout))

    def messages(self, type: str | None = None, ctx: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if isinstance(e, dict) and (type is None or e["type"] == type) and (ctx is None or e.get("ctx") == ctx)
        ]

    def frames(self, handle: int, kind: int = 1) -> list[Frame]:
        return [e for e in self.events if isinstance(e, Frame) and e.header.handle == handle and e.header.kind == kind]

    async def close(self) -> None:
        # Keep reading while closing: a client with unread messages stops reading its socket (websockets' max_queue)
        # and would never see the server's answer to its close frame.
        async def discard() -> None:
            with contextlib.suppress(ConnectionClosed):
                while True:
                    await self.ws.recv()

        await asyncio.gather(self.ws.close(), discard())


def _message(event: Event) -> dict[str, Any]:
    assert isinstance(event, dict)
    return event


async def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Message, bytes]:
    """GET `url`: status, headers (looked up case-insensitively, as HTTP names are), body."""

    def get() -> tuple[int, Message, bytes]:
        request = urllib.request.Request(url, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()

    return await asyncio.to_thread(get)
