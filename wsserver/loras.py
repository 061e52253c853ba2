"""LoRA adapters on the server: the start-up list (`--lora NAME=URI[#sha256=HEX]`), what sessions may name
(`LoRAs`), and `/v1/loras` (list; add from a URI and delete, with the admin key).

Adapters live in the engines (engine.lora); the server fetches an adapter's files into its cache directory and asks
every engine it holds to load that copy (an engine process reads it from the same disk). Every front end reaches
every engine, so an adapter added through one is soon listed by all (their engine stats carry the names). Deleting
an adapter that a generating segment uses is refused (409): wait for the segment, or cancel it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine import EngineError
from engine.lora import CONFIG_FILE, AdapterError
from engine.lora.source import AdapterSource, check_name, check_sha256, fetch
from engine.streams import EngineHandle
from wsserver.http import ApiError, json_response

if TYPE_CHECKING:
    from wsserver.config import ServerConfig
    from wsserver.server import TTSServer

logger = logging.getLogger(__name__)


class LoRAs:
    """The adapters every engine has loaded, read from their latest stats (a live view: protocol.LoRACatalog)."""

    def __init__(self, engines: list[EngineHandle]) -> None:
        self.engines = engines
        info = engines[0].info if engines else None
        self.max_loras = info.max_loras if info else 0
        self.max_lora_rank = info.max_lora_rank if info else 0

    def names(self) -> list[str]:
        if not self.engines:
            return []
        common = set(self.engines[0].stats().loras)
        for engine in self.engines[1:]:
            common &= set(engine.stats().loras)
        return sorted(common)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.names()


def resolve_start_loras(config: ServerConfig) -> tuple[tuple[str, str], ...]:
    """Fetch every `--lora` adapter into the cache (blocking): (name, local directory) for the engines to load at
    start. A source that cannot be fetched or fails its checksum stops the server with its reason."""
    return tuple((s.name, str(fetch(s.uri, s.sha256, config.lora_cache_dir))) for s in config.loras)


def describe(name: str, directory: Path | None) -> dict[str, object]:
    entry: dict[str, object] = {"id": name, "object": "lora"}
    if directory is not None:
        settings = json.loads((directory / CONFIG_FILE).read_text()).get("lora_config", {})
        entry.update(rank=settings.get("r"), alpha=settings.get("alpha"))
    return entry


def lora_routes(server: TTSServer) -> list[Route]:
    directories: dict[str, Path] = {}  # where this front end fetched the adapters it added

    def catalog() -> LoRAs:
        if not server.engines:
            raise ApiError(503, "starting", "the model is still loading", Retry_After="5")
        return LoRAs(server.engines)

    async def list_loras(_: Request) -> Response:
        loras = catalog()
        data = [{"id": name, "object": "lora"} for name in loras.names()]
        return json_response(
            200,
            {"object": "list", "data": data, "max_loras": loras.max_loras, "max_lora_rank": loras.max_lora_rank},
        )

    async def add_lora(request: Request) -> Response:
        loras = catalog()
        if loras.max_loras == 0:
            raise ApiError(409, "loras_disabled", "this server serves no LoRA adapters (start it with --max-loras N)")
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not isinstance(body.get("uri"), str):
            raise ApiError(400, "missing_field", "send {'name': str, 'uri': str, 'sha256': str (optional)}")
        sha256 = body.get("sha256")
        try:
            source = AdapterSource(check_name(body["name"]), body["uri"], check_sha256(sha256))
        except AdapterError as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        names = loras.names()
        if source.name in names:
            raise ApiError(409, "lora_exists", f"a LoRA adapter named {source.name!r} is loaded; delete it first")
        if len(names) >= loras.max_loras:
            raise ApiError(409, "too_many_loras", f"max_loras={loras.max_loras} adapters are loaded; delete one first")
        try:
            directory = await asyncio.to_thread(fetch, source.uri, source.sha256, server.config.lora_cache_dir)
        except AdapterError as exc:
            raise ApiError(400, "bad_lora_source", str(exc), param="uri") from None
        loaded: list[EngineHandle] = []
        try:
            for engine in server.engines:
                await engine.load_lora(source.name, directory)
                loaded.append(engine)
        except EngineError as exc:
            for engine in loaded:  # all engines or none
                await engine.unload_lora(source.name)
            raise ApiError(400, "bad_lora", str(exc)) from None
        directories[source.name] = directory
        logger.info("LoRA adapter %s loaded from %s", source.name, source.uri)
        return json_response(201, describe(source.name, directory))

    async def delete_lora(request: Request) -> Response:
        name = request.path_params["lora_id"]
        if name not in catalog().names():
            raise ApiError(404, "lora_not_found", f"no LoRA adapter {name!r}")
        removed: list[EngineHandle] = []
        try:
            for engine in server.engines:
                await engine.unload_lora(name)
                removed.append(engine)
        except EngineError as exc:
            if name in directories:  # put it back where it went, so that every engine agrees again
                for engine in removed:
                    await engine.load_lora(name, directories[name])
            raise ApiError(409, "lora_in_use", str(exc)) from None
        directories.pop(name, None)
        return json_response(200, {"id": name, "object": "lora", "deleted": True})

    return [
        Route("/v1/loras", list_loras, methods=["GET"]),
        Route("/v1/loras", add_lora, methods=["POST"]),
        Route("/v1/loras/{lora_id}", delete_lora, methods=["DELETE"]),
    ]
