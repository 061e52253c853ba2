"""wsserver.link: a worker's tickets over the supervisor's socket to the coordinator (the RemoteLink end to end)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from engine import EngineStats
from wsserver.coordinator import Coordinator, WorkerReport
from wsserver.link import RemoteLink, serve_coordinator

HEALTHY = EngineStats(0, 0, 0, 4, 0, 0, 0, 0.0, 0.0, healthy=True)


class Engine:
    def stats(self) -> EngineStats:
        return HEALTHY


async def test_a_ticket_avoids_the_engine_it_names(tmp_path: Path) -> None:
    """A segment moving off an engine that died under it asks, over the socket, for a slot on any other engine."""
    coordinator = Coordinator(8, [Engine(), Engine()], [1, 2])
    path = str(tmp_path / "coordinator.sock")
    server = await serve_coordinator(coordinator, path)
    link = await RemoteLink.connect(path, WorkerReport)
    try:
        first = link.queue(lambda _: None, continuing=False)
        assert await asyncio.wait_for(first.granted, 5) == 1  # the engine with the most room
        link.release(first)
        moved = link.queue(lambda _: None, continuing=True, avoid=1)
        assert await asyncio.wait_for(moved.granted, 5) == 0
        blocked = link.queue(lambda _: None, continuing=True, avoid=1)  # engine 0 is full: it waits
        waiting = link.queue(lambda _: None, continuing=False)  # a newcomer behind it takes engine 1's room
        assert await asyncio.wait_for(waiting.granted, 5) == 1 and not blocked.granted.done()
        link.release(moved)
        assert await asyncio.wait_for(blocked.granted, 5) == 0
    finally:
        await link.close()
        server.close()
        await server.wait_closed()


async def test_losing_the_coordinator_is_an_error_but_closing_the_link_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A drained worker closes its own link on the way out (every server shutdown): that is no error in its log. The
    coordinator going away under a worker is, and the worker drains (its link reads not ready, draining)."""
    coordinator = Coordinator(8, [Engine()], [1])
    path = str(tmp_path / "coordinator.sock")
    server = await serve_coordinator(coordinator, path)
    caplog.set_level(logging.INFO, logger="wsserver.link")
    closing = await RemoteLink.connect(path, WorkerReport)
    dropped = await RemoteLink.connect(path, WorkerReport)
    await closing.close()
    assert closing.lost.done() and not [r for r in caplog.records if r.levelno >= logging.ERROR]
    server.close()
    for transport in [w.transport for w in list(coordinator.seats) if hasattr(w, "transport")]:
        transport.close()  # the supervisor's end of the connection goes (its process died)
    await asyncio.wait_for(dropped.lost, 5)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "coordinator connection lost: closed"
    ]
    assert dropped.draining and not dropped.ready
    await server.wait_closed()
