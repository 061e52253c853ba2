"""LoRA adapters over a real server: `/v1/loras` (admin key), a context, a speech request and a voice naming one,
`hello`/`/info` announcing them, and every bad input answered with its own error while the rest goes on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file, save_file

from engine import AsyncEngine, EngineConfig
from engine.lora import CONFIG_FILE, WEIGHTS_FILE
from engine.lora.make_adapter import make_adapter
from engine.lora.source import file_sha256
from tests.conftest import _run_to_completion
from tests.e2e.client import Client
from tests.e2e.test_voices_api import upload
from tests.servers import running_server

ADMIN = {"Authorization": "Bearer admin-secret"}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint("voxcpm2", stop=False)


@pytest.fixture(scope="module")
def lora_engine(checkpoint: Path) -> Iterator[AsyncEngine]:
    engine = AsyncEngine(
        EngineConfig(model=str(checkpoint), device="cpu", max_num_seqs=8, max_patches=64, max_loras=2, max_lora_rank=8)
    )
    _run_to_completion(engine.start())
    yield engine
    _run_to_completion(engine.close())


@pytest.fixture(scope="module")
def adapters(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    made = {
        "calm": make_adapter(checkpoint, root / "calm", rank=4, scale=0.2),
        "other": make_adapter(checkpoint, root / "other", rank=2, seed=1),
        "third": make_adapter(checkpoint, root / "third", rank=2, seed=2),
        "big": make_adapter(checkpoint, root / "big", rank=16, seed=3),
    }
    unknown = make_adapter(checkpoint, root / "unknown-target", rank=2, seed=4)
    meta = json.loads((unknown / CONFIG_FILE).read_text())
    meta["lora_config"]["target_modules_lm"] = ["q_proj", "attn_proj"]
    (unknown / CONFIG_FILE).write_text(json.dumps(meta))
    misshaped = make_adapter(checkpoint, root / "misshaped", rank=2, seed=5)
    tensors = load_file(str(misshaped / WEIGHTS_FILE))
    tensors["base_lm.layers.0.self_attn.o_proj.lora_B"] = tensors["base_lm.layers.0.self_attn.o_proj.lora_B"][:-1]
    save_file(tensors, str(misshaped / WEIGHTS_FILE))
    return made | {"unknown-target": unknown, "misshaped": misshaped}


@pytest.fixture
async def running(
    lora_engine: AsyncEngine, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    store, cache = tmp_path_factory.mktemp("voices"), tmp_path_factory.mktemp("lora-cache")
    async with (
        running_server(lora_engine, store, admin_key="admin-secret", lora_cache_dir=cache, max_patches=6) as server,
        httpx.AsyncClient(base_url=server.http_url, timeout=60) as http,
    ):
        yield server, http
        for name in lora_engine.stats().loras:  # every test starts without adapters
            await lora_engine.unload_lora(name)


def error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def speech(http: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    body = {"input": "Hello there.", "voice": "default", "response_format": "pcm", "seed": 3, **fields}
    return await http.post("/v1/audio/speech", json=body)


async def test_add_use_and_delete(running: tuple[Any, httpx.AsyncClient], adapters: dict[str, Path]) -> None:
    server, http = running
    listing = (await http.get("/v1/loras")).json()
    assert (listing["data"], listing["max_loras"], listing["max_lora_rank"]) == ([], 2, 8)
    body = {"name": "calm", "uri": adapters["calm"].as_uri(), "sha256": file_sha256(adapters["calm"] / WEIGHTS_FILE)}
    assert error(await http.post("/v1/loras", json=body)) == (401, "unauthorized")  # the admin key adds
    created = await http.post("/v1/loras", json=body, headers=ADMIN)
    assert created.status_code == 201 and created.json() == {"id": "calm", "object": "lora", "rank": 4, "alpha": 16}
    assert [e["id"] for e in (await http.get("/v1/loras")).json()["data"]] == ["calm"]
    info = (await http.get("/info")).json()
    assert info["loras"] == {"loaded": ["calm"], "max_loras": 2, "max_lora_rank": 8}

    # A context with the adapter, one without, one naming an adapter that is not loaded.
    client = await Client.connect(server.ws_url)
    try:
        assert client.hello["loras"] == {"loaded": ["calm"], "max_loras": 2, "max_lora_rank": 8}
        await client.send("context.create", ctx="a", lora="calm", text="Hello with an adapter. ")
        await client.send("context.end", ctx="a")
        assert (await client.until_ended("a"))["type"] == "context.done"
        await client.send("context.create", ctx="x", lora="nope", text="Hello. ")
        refused = await client.until_message("error", ctx="x")
        assert refused["code"] == "bad_lora" and "'nope'" in refused["message"]
    finally:
        await client.close()

    plain, with_lora = await speech(http), await speech(http, lora="calm")
    assert plain.status_code == with_lora.status_code == 200
    assert len(plain.content) == len(with_lora.content) and plain.content != with_lora.content
    assert (await speech(http, lora="calm")).content == with_lora.content  # seeded: reproducible
    assert error(await speech(http, lora="nope")) == (400, "unknown_lora")

    # A voice that speaks with the adapter (requests may name another).
    admin = httpx.AsyncClient(base_url=server.http_url, timeout=60, headers=ADMIN)
    uploaded = await upload(admin, lora="calm")
    assert uploaded.status_code == 201, uploaded.text
    voice = uploaded.json()
    assert voice["lora"] == "calm" and voice["id"] != (await upload(admin)).json()["id"]
    assert (await speech(http, voice=voice["id"])).content == (
        await speech(http, voice=voice["id"], lora="calm")
    ).content
    assert error(await upload(admin, lora="nope")) == (400, "unknown_lora")
    await admin.aclose()

    assert error(await http.delete("/v1/loras/calm")) == (401, "unauthorized")
    deleted = await http.delete("/v1/loras/calm", headers=ADMIN)
    assert deleted.status_code == 200 and deleted.json()["deleted"]
    assert error(await http.delete("/v1/loras/calm", headers=ADMIN)) == (404, "lora_not_found")
    assert error(await speech(http, voice=voice["id"])) == (400, "unknown_lora")  # its voice's adapter is gone


async def test_delete_in_use_is_refused(running: tuple[Any, httpx.AsyncClient], adapters: dict[str, Path]) -> None:
    server, http = running
    body = {"name": "calm", "uri": str(adapters["calm"])}
    assert (await http.post("/v1/loras", json=body, headers=ADMIN)).status_code == 201
    client = await Client.connect(server.ws_url)
    try:
        # A long context that its client does not read: its segment stays in the engine (paused).
        await client.send("context.create", ctx="a", lora="calm", text="A long sentence to say. " * 8)
        await client.until_message("segment.started", ctx="a")
        refused = await http.delete("/v1/loras/calm", headers=ADMIN)
        assert error(refused) == (409, "lora_in_use") and "in use by 1 request" in refused.json()["error"]["message"]
        await client.send("context.cancel", ctx="a")
        await client.until_ended("a")
    finally:
        await client.close()
    for _ in range(200):
        response = await http.delete("/v1/loras/calm", headers=ADMIN)
        if response.status_code != 409:
            break
    assert response.status_code == 200


async def test_bad_requests(running: tuple[Any, httpx.AsyncClient], adapters: dict[str, Path], tmp_path: Path) -> None:
    _, http = running

    async def add(**body: Any) -> httpx.Response:
        return await http.post("/v1/loras", json=body, headers=ADMIN)

    assert error(await http.post("/v1/loras", content=b"{", headers=ADMIN)) == (400, "bad_json")
    assert error(await add(name="a")) == (400, "missing_field")
    assert error(await add(name="bad name", uri="/x")) == (400, "bad_request")
    assert error(await add(name="a", uri="/x", sha256="123")) == (400, "bad_request")
    calm = adapters["calm"].as_uri()
    mismatch = await add(name="a", uri=calm, sha256="0" * 64)
    assert error(mismatch) == (400, "bad_lora_source") and "checksum mismatch" in mismatch.json()["error"]["message"]
    assert error(await add(name="a", uri="http://127.0.0.1:9/nothing/")) == (400, "bad_lora_source")
    assert error(await add(name="a", uri=(tmp_path / "none").as_uri())) == (400, "bad_lora_source")
    cases = {
        "big": "rank r = 16 exceeds this engine's max LoRA rank 8",
        "unknown-target": "unknown target module(s) in target_modules_lm: attn_proj",
        "misshaped": "base_lm.layers.0.self_attn.o_proj.lora_B",
    }
    for name, message in cases.items():
        response = await add(name=name, uri=str(adapters[name]))
        assert error(response) == (400, "bad_lora") and message in response.json()["error"]["message"], name
    assert (await add(name="calm", uri=calm)).status_code == 201
    assert error(await add(name="calm", uri=calm)) == (409, "lora_exists")
    assert (await add(name="other", uri=str(adapters["other"]))).status_code == 201
    assert error(await add(name="third", uri=str(adapters["third"]))) == (409, "too_many_loras")
    assert error(await http.delete("/v1/loras/nope", headers=ADMIN)) == (404, "lora_not_found")
    # Nothing else was affected: both adapters still serve.
    assert [e["id"] for e in (await http.get("/v1/loras")).json()["data"]] == ["calm", "other"]
    assert (await speech(http, lora="other")).status_code == 200
