"""Faults (issue 17): an engine step that raises, an engine loop that dies, a full KV pool. Each gives clear errors,
/ready 503 once the server can no longer serve, and nothing hangs: not an open context, not a new one, not the
handshake. Every test has an engine of its own (a broken engine cannot be shared)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.exceptions import InvalidStatus

from engine import AsyncEngine, EngineConfig
from tests.e2e.client import Client, Frame, http_get
from tests.servers import running_server, until

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "
EngineFactory = Callable[..., Awaitable[AsyncEngine]]


@pytest.fixture
async def make_engine(tiny_checkpoint: Callable[..., Path]) -> AsyncIterator[EngineFactory]:
    engines: list[AsyncEngine] = []

    async def make(**config: Any) -> AsyncEngine:
        config = {"max_num_seqs": 8, "max_patches": 256, "coalesce_ms": 5, **config}
        engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint("voxcpm2", stop=False)), device="cpu", **config))
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.close()


async def ready_status(http_url: str) -> tuple[int, str]:
    status, _, body = await http_get(http_url + "/ready")
    return status, orjson.loads(body)["status"]


def break_step(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(batch: object, while_running: object) -> None:
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.core.runner, "run", run)


def kill_loop(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop itself fails between steps (not the core's step): its thread ends."""

    def run_commands() -> None:
        raise RuntimeError("engine thread died")

    monkeypatch.setattr(engine.loop, "_run_commands", run_commands)


@pytest.mark.parametrize(("fault", "said"), [(break_step, "device lost"), (kill_loop, "engine thread died")])
async def test_a_failed_engine_fails_its_contexts_and_the_server_stops_taking_work(
    make_engine: EngineFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[AsyncEngine, pytest.MonkeyPatch], None],
    said: str,
) -> None:
    engine = await make_engine()
    async with running_server(engine, tmp_path, max_patches=200) as running:
        client = await Client.connect(running.ws_url)
        await client.send("context.create", ctx="speaking", text=SENTENCE)
        await client.send("context.end", ctx="speaking")
        await client.until(lambda e: isinstance(e, Frame))
        fault(engine, monkeypatch)
        await client.send("context.create", ctx="waiting", text=SENTENCE)  # queued or admitted when it fails
        await client.send("context.end", ctx="waiting")

        ended = await client.until_ended("speaking", timeout=10)
        assert (ended["type"], ended["code"], ended["ended"]) == ("error", "internal", True)
        assert said in ended["message"]
        assert (await client.until_ended("waiting", timeout=10))["code"] == "internal"
        await client.send("ping", t=1)  # the session itself lives on
        await client.until_message("pong")

        # The coordinator notices within a quarter of a second: /ready and /health 503, handshakes refused.
        for _ in range(40):
            if await ready_status(running.http_url) == (503, "failed"):
                break
            await asyncio.sleep(0.05)
        assert await ready_status(running.http_url) == (503, "failed")
        assert (await http_get(running.http_url + "/health"))[0] == 503  # liveness: only a restart helps
        with pytest.raises(InvalidStatus) as refused:
            await Client.connect(running.ws_url)
        assert refused.value.response.status_code == 503
        # A context opened now would wait for a slot no engine will ever free: it fails at once instead.
        await client.send("context.create", ctx="late", text=SENTENCE)
        await client.send("context.end", ctx="late")
        late = await client.until_ended("late", timeout=5)
        assert (late["code"], late["ended"]) == ("internal", True) and "no engine is serving" in late["message"]
        status = orjson.loads((await http_get(running.http_url + "/status"))[2])
        assert not status["engine"]["healthy"] and status["contexts"]["queued"] == 0
        await client.close()


async def test_a_full_kv_pool_delays_admission_and_a_request_larger_than_the_pool_is_refused(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # Blocks of 16 positions, 8 of them: a segment of ~20 prompt positions and 40 patches reserves 4, so two fit.
    engine = await make_engine(kv_block_size=16, num_kv_blocks=8)
    total = engine.stats().kv_blocks_total
    async with running_server(engine, tmp_path, max_patches=40) as running:
        clients = [await Client.connect(running.ws_url) for _ in range(6)]
        for i, client in enumerate(clients):
            await client.send("context.create", ctx="c", text=SENTENCE, generation={"seed": i})
            await client.send("context.end", ctx="c")

        async def queued() -> bool:  # the engine holds the requests that do not fit yet in its own queue
            return engine.stats().waiting > 0

        await until(queued, timeout=30)
        done = await asyncio.gather(*(client.until_ended("c", timeout=60) for client in clients))
        assert [d["type"] for d in done] == ["context.done"] * 6

        async def freed() -> bool:  # the engine frees a request's blocks at the step after its last chunk
            return engine.stats().kv_blocks_free == total

        await until(freed, timeout=10)
        for client in clients:
            await client.close()
    async with running_server(engine, tmp_path, max_patches=200) as running:  # 200 patches need 14 blocks
        client = await Client.connect(running.ws_url)
        await client.send("context.create", ctx="huge", text=SENTENCE)
        await client.send("context.end", ctx="huge")
        refused = await client.until_ended("huge", timeout=10)
        assert (refused["code"], refused["ended"]) == ("internal", True) and "KV blocks" in refused["message"]
        assert engine.stats().healthy and engine.stats().kv_blocks_free == total
        await client.close()
