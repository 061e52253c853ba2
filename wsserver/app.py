"""The HTTP application on the WebSocket port (Starlette, served by uvicorn; upgrades go to wsserver.websocket).

Routes: probes and load figures (`/health`, `/ready`, `/status`, `/metrics`), what the server offers (`/info`,
`/v1/models`), voices (`/v1/voices`, wsserver.voice_routes), LoRA adapters (`/v1/loras`, wsserver.loras), OpenAI's
speech endpoint (`/v1/audio/speech`, wsserver.speech), and the web demo at `/`. The `/v1/` routes need the API key
when one is set; the probes, `/info` and the demo do not (they are for load balancers, scrapers and browsers).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from wsserver import messages as m
from wsserver.access import Caller
from wsserver.encoding import FORMATS
from wsserver.http import WS_PATH, ApiError, BodyLimit, Guard, json_response
from wsserver.loras import LoRAs, lora_routes
from wsserver.speech import DEFAULT_RATE, OPENAI_MODELS, speech_routes
from wsserver.voice_routes import voice_routes

if TYPE_CHECKING:
    from wsserver.server import TTSServer

JSON_BODY_BYTES = 1024 * 1024
FORM_OVERHEAD_BYTES = 64 * 1024  # multipart framing and the text fields around an uploaded file


def make_app(server: TTSServer) -> Starlette:
    started = int(time.time())

    async def health(_: Request) -> Response:
        if not server.alive:  # every engine failed: only a restart helps
            return json_response(503, {"status": "engine failed"})
        return json_response(200, {"status": "ok"})

    async def ready(_: Request) -> Response:
        state = server.state
        return json_response(200 if state == "ready" else 503, {"status": state})

    async def status(_: Request) -> Response:
        return json_response(200, await server.status())

    async def metrics(_: Request) -> Response:
        if server.link is None:
            raise ApiError(503, "starting", "the model is still loading", Retry_After="5")
        return Response(
            await server.render_metrics(),
            headers={"Cache-Control": "no-store"},
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    async def websocket_probe(request: Request) -> Response:
        # A plain GET of the WebSocket path answers what a handshake would get: browsers hide a refused handshake's
        # status from the page, so the web demo asks here to tell "busy" (503) from "not authorised" (401).
        caller = caller_of(request)
        refusal = await server.admit(caller)
        if refusal is not None:
            raise refusal
        server.free_seat(caller)  # only asking
        raise ApiError(426, "upgrade_required", "open a WebSocket here", Upgrade="websocket")

    async def info(_: Request) -> Response:
        if server.engine is None or server.voices is None:
            raise ApiError(503, "starting", "the model is still loading", Retry_After="5")
        model = server.engine.info
        config = server.config
        speech_formats = {
            name: {
                "content_type": fmt.content_type,
                "sample_rates": sorted({*fmt.rates, model.sample_rate} if fmt.any_rate else set(fmt.rates)),
            }
            for name, fmt in FORMATS.items()
        }
        return json_response(
            200,
            {
                "model": {
                    "name": model.name,
                    "family": model.family,
                    "architecture": model.architecture,
                    "sample_rate": model.sample_rate,
                    "encoder_sample_rate": model.encoder_sample_rate,
                    "samples_per_patch": model.samples_per_patch,
                    "supports_reference": model.supports_reference,
                    "continuation": model.continuation,
                    "speakers": list(model.speakers),
                    "instruction": model.instruction,
                    "languages": list(model.languages),
                    "audio_encoder_id": model.audio_encoder_id,
                },
                "websocket": {
                    "path": WS_PATH,
                    "formats": list(m.FORMATS),
                    "sample_rates": sorted({*m.PCM_RATES, model.sample_rate}),
                    "limits": config.limits.advertised(),
                },
                "speech": {"formats": speech_formats, "default_sample_rate": DEFAULT_RATE, "speed": [1.0]},
                "voices": {
                    "count": len(server.voices.ids()),
                    "roles": list(model.voice_roles),
                    "aliases": server.voices.aliases,
                    "max_voices": config.max_voices,
                    "uploads": config.uploads.advertised(),
                },
                "max_connections": config.max_connections,
                "loras": {
                    "loaded": LoRAs(server.engines).names(),
                    "max_loras": model.max_loras,
                    "max_lora_rank": model.max_lora_rank,
                },
            },
        )

    async def models(_: Request) -> Response:
        if server.engine is None:
            raise ApiError(503, "starting", "the model is still loading", Retry_After="5")
        names = [server.engine.info.name, *OPENAI_MODELS]
        data = [{"id": name, "object": "model", "created": started, "owned_by": "voxstream"} for name in names]
        return json_response(200, {"object": "list", "data": data})

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return ApiError(exc.status_code, code, str(exc.detail)).response()

    upload_bytes = server.config.uploads.max_bytes + FORM_OVERHEAD_BYTES

    def body_limit(path: str) -> int:
        return upload_bytes if path == "/v1/voices" else JSON_BODY_BYTES

    def caller_of(request: Request) -> Caller:
        return server.caller(request.headers, request.url.query, request.client.host if request.client else None)

    def api_key(scope: Scope) -> ApiError | None:
        """The /v1/ routes need the API key and an allowed origin; the ones that change the server's state (adding or
        deleting voices or LoRA adapters) the admin key, when one is set."""
        if not scope["path"].startswith("/v1/"):
            return None
        changes = scope["method"] in ("POST", "DELETE") and scope["path"].startswith(("/v1/voices", "/v1/loras"))
        return server.authorize(caller_of(Request(scope)), admin=changes)

    routes = [
        Route("/health", health),
        Route("/ready", ready),
        Route("/status", status),
        Route("/metrics", metrics),
        Route("/info", info),
        Route(WS_PATH, websocket_probe),
        Route("/v1/models", models),
        *voice_routes(server),
        *lora_routes(server),
        *speech_routes(server),
        Mount("/", StaticFiles(directory=server.config.static_dir, html=True)),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, check=api_key), Middleware(BodyLimit, limit=body_limit)],
        exception_handlers={ApiError: api_error, HTTPException: http_error},
    )
