"""The asyncio client: contexts on a session that is reopened whenever the server cannot take new work.

A session stays open for many contexts. When the server drains (`warning: draining`, close 4503), closes the session
(idle timeout, network loss) or refuses the handshake (HTTP 503 with `Retry-After`, the 4429 race), the next context
opens a new session, retrying for `reconnect_timeout_s` (so behind a load balancer it lands on another replica, or on
this one once it is back). Contexts still open on a draining session finish there.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import InvalidMessage, InvalidStatus

from wsserver.client.connection import Busy, Connection
from wsserver.client.context import Context, Synthesis
from wsserver.client.events import ConnectionLost, ContextFailed, Rejected, Unavailable

WS_PATH = "/v1/tts/ws"
RETRY_STATUSES = (429, 502, 503, 504)  # the server (or a proxy in front of it) may take the session later


def websocket_url(url: str) -> str:
    """`http://host:8000` or `ws://host:8000` -> `ws://host:8000/v1/tts/ws`; a URL with a path is kept as it is."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else WS_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class Client:
    """`async with Client("ws://host:8000") as client:` then `ctx = await client.context(...)`."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        reconnect_timeout_s: float = 30.0,
        max_retry_delay_s: float = 5.0,
        open_timeout_s: float = 10.0,
    ) -> None:
        self.url = websocket_url(url)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.reconnect_timeout_s = reconnect_timeout_s
        self.max_retry_delay_s = max_retry_delay_s  # a server's Retry-After is honoured up to this
        self.open_timeout_s = open_timeout_s
        self._current: Connection | None = None
        self._retired: set[Connection] = set()
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def hello(self) -> dict[str, Any]:
        """The `hello` of the current session (model, formats, rates, voices, limits)."""
        if self._current is None:
            raise RuntimeError("not connected: await client.connect() first")
        return self._current.hello

    async def connect(self) -> Connection:
        """The session new contexts go to, opened (or reopened) if needed."""
        async with self._lock:
            self._retired = {connection for connection in self._retired if connection.lost is None}
            if self._current is not None and self._current.usable:
                return self._current
            if self._current is not None:
                self._retire(self._current)
            self._current = await self._open()
            return self._current

    async def context(
        self,
        ctx: str | None = None,
        *,
        voice: str | None = None,
        lora: str | None = None,
        instruction: str | None = None,
        language: str | None = None,
        output: Mapping[str, Any] | None = None,
        buffering: Mapping[str, Any] | None = None,
        generation: Mapping[str, Any] | None = None,
        text: str | None = None,
        decode: bool = True,
    ) -> Context:
        """Open a context (`context.create`; the settings are the protocol's, e.g. `output={"format": "opus"}`).
        `lora` names a loaded LoRA adapter (`hello.loras.loaded`); `instruction` and `language` go to a model that
        takes them (`hello.model`). Raises `ContextFailed` if the server refuses it (`bad_voice`, `bad_lora`,
        `bad_format`, `unsupported`, ...).
        `decode=False`: the context yields each frame as sent (`Packet`) instead of decoded `Audio`."""
        settings = {
            "voice": voice,
            "lora": lora,
            "instruction": instruction,
            "language": language,
            "output": output,
            "buffering": buffering,
            "generation": generation,
            "text": text,
        }
        fields = {name: dict(v) if isinstance(v, Mapping) else v for name, v in settings.items() if v is not None}
        ctx = ctx or uuid.uuid4().hex
        connection = await self.connect()
        try:
            return await connection.create(ctx, fields, decode=decode)
        except ContextFailed as failed:
            if failed.code != "over_capacity":
                raise
            connection.draining = True  # the create raced the draining warning
        except ConnectionLost:
            pass  # the session closed under the create (idle timeout, drain): once more on a new one
        return await (await self.connect()).create(ctx, fields, decode=decode)

    async def synthesize(self, text: str, **settings: Any) -> Synthesis:
        """One whole text: a context with `text`, ended at once, collected (audio, segment timing, result)."""
        context = await self.context(text=text, **settings)
        await context.end()
        return await context.collect()

    async def close(self) -> None:
        connections = [*self._retired, *([self._current] if self._current is not None else [])]
        self._current, self._retired = None, set()
        await asyncio.gather(*(connection.close() for connection in connections))

    def _retire(self, connection: Connection) -> None:
        connection.retired = True
        if connection.contexts and connection.lost is None:
            self._retired.add(connection)  # closes itself once its contexts end
        else:
            asyncio.get_running_loop().create_task(connection.close())

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_timeout_s
        backoff = 0.1
        while True:
            try:
                return await Connection.open(self.url, self.headers, self.open_timeout_s)
            except InvalidStatus as refused:
                response = refused.response
                if response.status_code not in RETRY_STATUSES:
                    raise Rejected(response.status_code, response.body or b"") from refused
                retry_after = _seconds(response.headers.get("Retry-After"))
                wait, error = retry_after if retry_after is not None else backoff, refused
            except (OSError, TimeoutError, InvalidMessage, Busy) as failed:
                # InvalidMessage: the TCP connection closed before any HTTP response, as one accepted into the
                # backlog of a server that is shutting down does; the next try may reach its replacement
                wait, error = backoff, failed
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise Unavailable(f"no session at {self.url} within {self.reconnect_timeout_s} s: {error}") from error
            await asyncio.sleep(min(wait, self.max_retry_delay_s, remaining))
            backoff = min(2 * backoff, self.max_retry_delay_s)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: not what this server sends; back off instead
