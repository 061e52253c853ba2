"""wsserver.link: a worker's tickets over the supervisor's socket to the coordinator (the RemoteLink end to end)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest

from engine import EngineError, EngineStats
from wsserver.coordinator import Coordinator, WorkerReport
from wsserver.link import RemoteLink, serve_coordinator

HEALTHY = EngineStats(0, 0, 0, 4, 0, 0, 0, 0.0, 0.0, healthy=True)


class Engine:
    def __init__(self) -> None:
        self.healthy = True

    def stats(self) -> EngineStats:
        return dataclasses.replace(HEALTHY, healthy=self.healthy)


async def settled(*links: RemoteLink) -> None:
    """Every message the coordinator has sent these links has arrived: a call's reply comes after them."""
    for link in links:
        await asyncio.wait_for(link.status(), 5)


def no_position(_: int) -> None:
    pass


async def test_a_ticket_avoids_the_engine_it_names(tmp_path: Path) -> None:
    """A segment moving off an engine that died under it asks, over the socket, for a slot on any other engine. With
    two engines, no spare: every ticket goes to the engine with the most room when it asks."""
    coordinator = Coordinator(8, [Engine(), Engine()], [1, 2])
    path = str(tmp_path / "coordinator.sock")
    server = await serve_coordinator(coordinator, path)
    link = await RemoteLink.connect(path, WorkerReport)
    try:
        first = link.queue(no_position, continuing=False)
        assert await asyncio.wait_for(first.granted, 5) == 1  # the engine with the most room
        link.release(first)
        moved = link.queue(no_position, continuing=True, avoid=1)
        assert await asyncio.wait_for(moved.granted, 5) == 0
        blocked = link.queue(no_position, continuing=True, avoid=1)  # engine 0 is full: it waits
        waiting = link.queue(no_position, continuing=False)  # a newcomer behind it takes engine 1's room
        assert await asyncio.wait_for(waiting.granted, 5) == 1 and not blocked.granted.done()
        link.release(moved)
        assert await asyncio.wait_for(blocked.granted, 5) == 0
        assert coordinator.queue.spares == {}
    finally:
        await link.close()
        server.close()
        await server.wait_closed()


async def test_a_spare_is_called_back_for_a_ticket_that_would_wait(tmp_path: Path) -> None:
    """While there is room a worker holds a spare slot; once a ticket elsewhere cannot be granted, the spare comes
    back and that ticket gets its slot. The status counts segments, not spares."""
    coordinator = Coordinator(8, [Engine()], [2])
    path = str(tmp_path / "coordinator.sock")
    server = await serve_coordinator(coordinator, path)
    spared = await RemoteLink.connect(path, WorkerReport)
    other = await RemoteLink.connect(path, WorkerReport)
    try:
        await settled(spared, other)
        assert [worker for worker, _ in coordinator.queue.spares] == [next(iter(coordinator.seats))]  # the first's
        assert (await other.status())["contexts"]["generating"] == 0
        first = other.queue(no_position, continuing=False)
        assert await asyncio.wait_for(first.granted, 5) == 0
        second = other.queue(no_position, continuing=False)  # the last slot is the other worker's spare
        assert await asyncio.wait_for(second.granted, 5) == 0
        status = await other.status()
        assert status["contexts"]["generating"] == 2 and status["contexts"]["queued"] == 0
        assert coordinator.queue.spares == {}
        other.release(first)
        other.release(second)
        await settled(spared, other)
        assert len(coordinator.queue.spares) == 1  # room again: a spare again
        engine = (await other.status())["engines"][0]
        assert engine["generating"] == 0 and engine["segments"] == 2
    finally:
        for link in (spared, other):
            await link.close()
        server.close()
        await server.wait_closed()


async def test_a_spare_on_an_engine_that_fails_is_called_back(tmp_path: Path) -> None:
    """The worker must not start a segment on a failed engine's slot: its spare goes back, and comes again once the
    engine serves."""
    engine = Engine()
    coordinator = Coordinator(8, [engine], [4])
    path = str(tmp_path / "coordinator.sock")
    server = await serve_coordinator(coordinator, path)
    link = await RemoteLink.connect(path, WorkerReport)
    try:
        await settled(link)
        assert len(coordinator.queue.spares) == 1
        engine.healthy = False
        coordinator.check_engines()
        await settled(link)  # the call back arrives; the release goes before the reply
        assert coordinator.queue.spares == {} and coordinator.queue.used == [0]
        refused = link.queue(no_position, continuing=False)
        with pytest.raises(EngineError):
            await asyncio.wait_for(refused.granted, 5)
        link.release(refused)
        engine.healthy = True
        coordinator.check_engines()
        await settled(link)
        ticket = link.queue(no_position, continuing=False)
        assert ticket.granted.done() and ticket.granted.result() == 0
        link.release(ticket)
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
