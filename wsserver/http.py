"""Plain HTTP on the WebSocket port: probes, status, metrics and the web demo, as a Starlette application.

uvicorn serves it; WebSocket upgrades never reach it (wsserver.websocket). Every error body has OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`, which the OpenAI-compatible clients parse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

if TYPE_CHECKING:
    from wsserver.server import TTSServer

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


def make_app(server: TTSServer) -> Starlette:
    async def health(_: Request) -> Response:
        return json_response(200, {"status": "ok"})

    async def ready(_: Request) -> Response:
        state = "draining" if server.draining else "ready" if server.ready else "starting"
        return json_response(200 if state == "ready" else 503, {"status": state})

    async def status(_: Request) -> Response:
        return json_response(200, server.status())

    async def metrics(_: Request) -> Response:
        return Response(
            server.render_metrics(),
            headers={"Cache-Control": "no-store"},
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    async def websocket_probe(request: Request) -> Response:
        # A plain GET of the WebSocket path answers what a handshake would get: browsers hide a refused handshake's
        # status from the page, so the web demo asks here to tell "busy" (503) from "not authorised" (401).
        refusal = server.admission(request.headers.get("Authorization"), request.url.query)
        if refusal is not None:
            raise refusal
        raise ApiError(426, "upgrade_required", "open a WebSocket here", Upgrade="websocket")

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return ApiError(exc.status_code, code, str(exc.detail)).response()

    routes = [
        Route("/health", health),
        Route("/ready", ready),
        Route("/status", status),
        Route("/metrics", metrics),
        Route(WS_PATH, websocket_probe),
        Mount("/", StaticFiles(directory=server.config.static_dir, html=True)),
    ]
    return Starlette(routes=routes, exception_handlers={ApiError: api_error, HTTPException: http_error})
