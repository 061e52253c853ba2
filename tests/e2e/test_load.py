"""50 sessions streaming text at once: every one gets all of its audio, in order, with no error."""

from __future__ import annotations

import asyncio
import time

from tests.e2e.client import Client, Frame
from tests.e2e.test_guarantees import check_ordering
from tests.servers import ServeFactory

SESSIONS = 50
TEXT = "Hello, this is one of many sessions. It streams text word by word. "


async def one_session(url: str, i: int) -> tuple[float, dict]:
    client = await Client.connect(url)
    await client.send("context.create", ctx="t", generation={"seed": i})
    started = time.monotonic()
    for word in TEXT.split(" "):
        await client.send("text.append", ctx="t", text=word + " ")
        await asyncio.sleep(0.005)
    await client.send("context.end", ctx="t")
    first = await client.until(lambda e: isinstance(e, Frame) and e.header.kind == 1, timeout=120)
    first_frame_s = time.monotonic() - started
    done = await client.until_ended("t", timeout=120)
    handle = client.messages("context.created", "t")[0]["handle"]
    assert first.header.handle == handle
    check_ordering(client.frames(handle), 2)
    assert not client.messages("error")
    await client.close()
    return first_frame_s, done


async def test_fifty_concurrent_sessions(serve: ServeFactory) -> None:
    async with serve(max_patches=4) as running:
        results = await asyncio.gather(*(one_session(running.ws_url, i) for i in range(SESSIONS)))
        assert all(done["type"] == "context.done" and done["audio_ms"] > 0 for _, done in results)
        assert running.server.metrics.contexts["done"] == SESSIONS
