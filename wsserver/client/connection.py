"""One `ttsws/1` session: the WebSocket, its reader, and the contexts open on it.

The reader is the only task that receives; it routes each message by `ctx` and each frame by its handle to the
context it belongs to (a handle is unique among a session's open contexts, and no frame of a context follows its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from wsserver.client.context import Context
from wsserver.client.events import ConnectionLost
from wsserver.frames import FrameHeader

logger = logging.getLogger(__name__)

SUBPROTOCOL = "ttsws.v1"


class Busy(Exception):
    """The server accepted the handshake and closed the session at once (over capacity, the handshake race)."""


class Connection:
    def __init__(self, ws: ClientConnection, hello: dict[str, Any]) -> None:
        self.ws, self.hello = ws, hello
        self.contexts: dict[str, Context] = {}
        self.draining = False  # the server said `draining`: open contexts may finish, new ones go elsewhere
        self.retired = False  # the client opens new contexts elsewhere; close once the open ones end
        self.lost: ConnectionLost | None = None
        self._by_handle: dict[int, Context] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str, headers: dict[str, str], open_timeout_s: float) -> Connection:
        """Connect and read `hello`. Raises websockets' `InvalidStatus` for a refused handshake, `Busy` when the
        session is closed before its `hello`, `OSError`/`TimeoutError` when the server cannot be reached, and
        `InvalidMessage` when the connection closes before any HTTP response."""
        ws = await connect(
            url,
            additional_headers=headers,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            open_timeout=open_timeout_s,
            compression=None,  # audio does not compress; the server declines it anyway
        )
        try:
            async with asyncio.timeout(open_timeout_s):
                first = orjson.loads(await ws.recv())
        except ConnectionClosed as closed:
            raise Busy(f"closed before hello ({closed.rcvd.code if closed.rcvd else None})") from closed
        if first.get("type") != "hello":
            await ws.close()
            raise Busy(f"{first.get('code')}: {first.get('message')}")
        return cls(ws, first)

    @property
    def usable(self) -> bool:
        return self.lost is None and not self.draining and not self.retired

    async def send(self, type: str, **fields: Any) -> None:
        if self.lost is not None:
            raise self.lost
        try:
            await self.ws.send(orjson.dumps({"type": type, **fields}).decode())
        except ConnectionClosed as closed:
            raise self._closed(closed) from closed

    async def create(self, ctx: str, fields: dict[str, Any], *, decode: bool = True) -> Context:
        """`context.create`, answered: the context once `context.created` came (ContextFailed if it was refused)."""
        if ctx in self.contexts:
            raise ValueError(f"context {ctx!r} is open on this session")
        context = Context(self, ctx, decode=decode)
        self.contexts[ctx] = context
        try:
            await self.send("context.create", ctx=ctx, **fields)
        except ConnectionLost:
            self.contexts.pop(ctx, None)
            raise
        await context.created()
        return context

    def forget(self, context: Context) -> None:
        """A context ended: no message or frame of it can follow."""
        self.contexts.pop(context.id, None)
        if context.handle is not None and self._by_handle.get(context.handle) is context:
            del self._by_handle[context.handle]
        if self.retired and not self.contexts:
            asyncio.get_running_loop().create_task(self.close())

    async def close(self) -> None:
        await self.ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                if isinstance(data, bytes):
                    header, payload = FrameHeader.unpack(data)
                    if (context := self._by_handle.get(header.handle)) is not None:
                        context.on_frame(header, payload)
                else:
                    self._on_message(orjson.loads(data))
        except ConnectionClosed:
            pass
        finally:
            lost = self._closed(None)
            for context in list(self.contexts.values()):
                context.finish(lost)

    def _on_message(self, message: dict[str, Any]) -> None:
        ctx = message.get("ctx")
        if ctx is not None:
            if (context := self.contexts.get(ctx)) is not None:
                if message["type"] == "context.created":
                    self._by_handle[message["handle"]] = context
                context.on_message(message)
            return
        kind = message["type"]
        if kind == "warning":
            if message["code"] == "draining":
                self.draining = True
            for context in list(self.contexts.values()):
                context.on_message(message)
        elif kind == "error":
            # Session-wide errors are faults of this client (bad_json, rate_limited, ...): worth a log line.
            logger.warning("ttsws session error: %s: %s", message["code"], message["message"])

    def _closed(self, closed: ConnectionClosed | None) -> ConnectionLost:
        if self.lost is None:
            rcvd = closed.rcvd if closed is not None else None
            code = rcvd.code if rcvd is not None else self.ws.close_code
            self.lost = ConnectionLost(code, rcvd.reason if rcvd is not None else self.ws.close_reason or "")
        return self.lost
