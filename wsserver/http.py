"""What every HTTP route shares: the error type and body, JSON responses, and the request body limit.

Every error body has OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, which the OpenAI-compatible
clients parse; `code` is ours and precise, `type` OpenAI's coarse class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

WS_PATH = "/v1/tts/ws"
RETRY_AFTER_S = 5  # what a refused client is told to wait (full, starting or draining)


class ApiError(Exception):
    """An HTTP error with OpenAI's error body. `type` is OpenAI's coarse class, `code` our precise one."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None, **headers: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = {name.replace("_", "-"): value for name, value in headers.items()}

    @property
    def type(self) -> str:
        if self.status >= 500:
            return "server_error"
        return {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
            self.status, "invalid_request_error"
        )

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return json_response(self.status, self.body(), **self.headers)


def over_capacity(message: str) -> ApiError:
    return ApiError(503, "over_capacity", message, Retry_After=str(RETRY_AFTER_S))


def json_response(status: int, payload: Any, **headers: str) -> Response:
    return Response(
        orjson.dumps(payload), status, {"Cache-Control": "no-store", **headers}, media_type="application/json"
    )


class Guard:
    """ASGI middleware: refuse a request (with `check`'s error) before any route sees it."""

    def __init__(self, app: ASGIApp, check: Callable[[Scope], ApiError | None]) -> None:
        self.app, self.check = app, check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (refusal := self.check(scope)) is not None:
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: 413 for a request body over `limit(path)` bytes, announced (Content-Length, refused before a
    byte is read) or streamed (refused once the count passes the limit), so no route ever buffers more."""

    def __init__(self, app: ASGIApp, limit: Callable[[str], int]) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope["path"])
        too_big = ApiError(413, "body_too_large", f"the request body exceeds {limit} bytes")
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > limit:
            await too_big.response()(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise too_big
            return message

        await self.app(scope, counted, send)
