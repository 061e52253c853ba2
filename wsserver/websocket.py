"""The WebSocket side of the port: uvicorn parses every request, and hands an upgrade to a websockets connection.

uvicorn calls the `ws` protocol factory of its configuration with the upgraded socket and the request it parsed; the
factory here answers with websockets' own asyncio `ServerConnection`, which runs the opening handshake (the admission
checks below), then `TTSServer.handle`. So a session talks to the socket through websockets directly, not through
ASGI messages: the guarantees of `wsserver.server` need the transport itself (a bounded kernel send buffer, awaiting
each send, aborting a client that stopped reading), which an ASGI WebSocket hides.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from websockets.asyncio.server import Server, ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

from wsserver.access import Caller
from wsserver.http import WS_PATH, ApiError

if TYPE_CHECKING:
    from wsserver.server import TTSServer

logger = logging.getLogger(__name__)


class _Redact(logging.Filter):
    """websockets logs every handshake's request line and headers at DEBUG: the API key, in ?token=KEY or in the
    Authorization header, must not reach a log."""

    _SECRETS = re.compile(r"(token=)[^&\s]+|(authorization: )\S.*", re.IGNORECASE)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self._SECRETS.sub(lambda m: (m.group(1) or m.group(2)) + "[redacted]", message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


logger.addFilter(_Redact())

SUBPROTOCOL = "ttsws.v1"
OPEN_TIMEOUT_S = 10.0  # the opening handshake, as websockets' serve() bounds it


class Upgrades(Server):
    """websockets' server object for the connections that uvicorn accepted and upgraded. It never listens itself:
    it runs each connection's handshake and handler, and keeps the registry websockets expects of a server."""

    def __init__(self, tts: TTSServer) -> None:
        super().__init__(create_server=self._listens_nowhere, handler=self._run, logger=logger)
        self.tts = tts

    @staticmethod
    async def _listens_nowhere() -> asyncio.Server:
        raise RuntimeError("uvicorn owns the listening socket")

    def is_serving(self) -> bool:
        # A handshake completing while the server drains is refused with 503 (websockets checks this last).
        return not self.tts.draining

    def protocol_factory(self) -> Callable[..., ServerConnection]:
        """uvicorn's `ws` setting: called with (config, server_state, app_state) per upgraded connection."""
        limits = self.tts.config.limits

        def make(**_uvicorn: Any) -> ServerConnection:
            protocol = ServerProtocol(
                # No permessage-deflate, which browsers and websockets clients offer by default: audio does not
                # compress, and compressing every frame took 84% of the event loop at 128 sessions on an H200 host
                # (py-spy), starving every stream; the JSON messages are too few and small to gain from it.
                extensions=None,
                subprotocols=[SUBPROTOCOL],
                select_subprotocol=lambda _protocol, offered: SUBPROTOCOL if SUBPROTOCOL in offered else None,
                # Messages between max_message_bytes and this are refused by the session with an error and 4413;
                # only absurd ones are cut off by the WebSocket layer (1009).
                max_size=4 * limits.max_message_bytes,
                logger=logger,
            )
            return ServerConnection(protocol, self, write_limit=64 * 1024)

        return make

    async def _run(self, connection: ServerConnection) -> None:
        """One upgraded connection, as websockets' serve() runs it: the handshake, then the session; the transport is
        never left open behind a failed handshake or a crashed handler, and the session's seat goes back."""
        seated: list[Caller] = []  # the caller whose seat this session holds, once taken
        try:
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                await connection.handshake(lambda conn, request: self._admit(conn, request, seated))
            if connection.protocol.state is not State.OPEN:
                connection.transport.abort()
                return
            self.all_connections.add(connection)
            connection.start_keepalive()
            try:
                async with connection:
                    await self.tts.handle(connection)
            except Exception:
                logger.exception("session handler failed")
            finally:
                self.all_connections.discard(connection)
        except Exception:
            connection.transport.abort()
        finally:
            if seated:
                self.tts.free_seat(seated[0])
            self.handler_tasks.discard(asyncio.current_task())  # type: ignore[arg-type]

    async def _admit(self, connection: ServerConnection, request: Request, seated: list[Caller]) -> Response | None:
        """The handshake's checks: the path, then the server's admission (key, origin, state, a seat under
        max_connections and the client's limits), which takes the session's seat."""
        url = urlsplit(request.path)
        caller = self.tts.caller(
            {name.lower(): value for name, value in request.headers.raw_items()},
            url.query,
            connection.remote_address[0] if connection.remote_address else None,
        )
        if url.path != WS_PATH:
            refusal: ApiError | None = ApiError(404, "not_found", f"WebSocket sessions open at {WS_PATH}")
        else:
            refusal = await self.tts.admit(caller)
        if refusal is None:
            seated.append(caller)
            return None
        body = orjson.dumps(refusal.body())
        headers = Headers({"Content-Type": "application/json", "Content-Length": str(len(body)), **refusal.headers})
        return Response(refusal.status, HTTPStatus(refusal.status).phrase, headers, body)
