"""Plain HTTP on the WebSocket port: probes, status, metrics, the web demo, and the handshake's admission checks.

Hooked in as websockets' `process_request`: returning a Response answers the request, returning None lets the
WebSocket handshake proceed.
"""

from __future__ import annotations

import hmac
import mimetypes
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import orjson
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

if TYPE_CHECKING:
    from wsserver.server import TTSServer

WS_PATH = "/v1/tts/ws"
RETRY_AFTER_S = 5


def response(status: int, body: bytes, content_type: str, **extra: str) -> Response:
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body)), "Cache-Control": "no-store"})
    for name, value in extra.items():
        headers[name.replace("_", "-")] = value
    return Response(status, HTTPStatus(status).phrase, headers, body)


def json_response(status: int, payload: Any, **extra: str) -> Response:
    return response(status, orjson.dumps(payload), "application/json", **extra)


def make_process_request(server: TTSServer) -> Callable[[ServerConnection, Request], Response | None]:
    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        if url.path == WS_PATH:
            return _admit(server, request, url.query)
        if url.path == "/health":
            return json_response(200, {"status": "ok"})
        if url.path == "/ready":
            state = "draining" if server.draining else "ready" if server.ready else "starting"
            return json_response(200 if state == "ready" else 503, {"status": state})
        if url.path == "/status":
            return json_response(200, server.status())
        if url.path == "/metrics":
            return response(200, server.render_metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        return _static(server.config.static_dir, url.path)

    return process_request


def _admit(server: TTSServer, request: Request, query: str) -> Response | None:
    key = server.config.api_key
    if key is not None:
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else (parse_qs(query).get("token") or [""])[0]
        if not hmac.compare_digest(token.encode(), key.encode()):
            return json_response(401, {"error": "unauthorized", "message": "Authorization: Bearer KEY or ?token=KEY"})
    if not server.ready or server.draining:
        reason = "draining" if server.draining else "starting"
        return json_response(503, {"error": "over_capacity", "message": reason}, Retry_After=str(RETRY_AFTER_S))
    if len(server.connections) >= server.config.max_connections:
        message = f"max_connections={server.config.max_connections} sessions are open"
        return json_response(503, {"error": "over_capacity", "message": message}, Retry_After=str(RETRY_AFTER_S))
    return None


def _static(root: Path, path: str) -> Response:
    root = root.resolve()
    target = (root / path.lstrip("/")).resolve()
    if target.is_dir():
        target = target / "index.html"
    if not target.is_relative_to(root) or not target.is_file():
        return json_response(404, {"error": "not found"})
    content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    if target.suffix == ".js":  # AudioWorklet modules must be served as JavaScript
        content_type = "text/javascript"
    return response(200, target.read_bytes(), content_type)
