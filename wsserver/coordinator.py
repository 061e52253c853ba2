"""The server-wide state behind every front end: session seats (`max_connections`), the engine-slot FIFO in front of
every engine (wsserver.admission), the engines' health, and the whole server's status and metrics.

There is one Coordinator per server. A single-process server keeps it beside its sessions; with worker processes it
lives in the supervisor and each worker reaches it over a Unix socket (wsserver.link). Either way a front end is a
`WorkerPort`: the coordinator grants its tickets, tells it their places in the queue and the server's state, and asks
it for a report when someone asks for the status. Everything here runs on one event loop.

Spares. A worker's ticket costs a round trip to the supervisor before its segment can start (~0.3 ms on an H200's
host, more on a cold first one: docs/benchmarks.md, "End to end over the WebSocket"). So while the server has room, each
worker that joined with `spares` holds one slot in advance (wsserver.admission): its next segment takes it at once and
tells the coordinator (`claim`), which hands the worker a new spare if there is still room. When a ticket has to wait,
or a spare's engine fails, the coordinator calls the spares back (`revoke`); a worker that has not used its spare by
then releases it, one that has already claimed it ignores the call. A segment that claims its spare while the call is on
its way starts ahead of the ticket that waits, by that one round trip. A server with several engines holds no spares: a
spare is on the engine that had the most room when it was held, and a new context goes to the one that has the most when
it starts.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine import EngineStats
from engine.outputs import STEP_BUCKETS_S
from wsserver.admission import ClientLimits, SlotQueue
from wsserver.metrics import Histogram, ServerMetrics

logger = logging.getLogger(__name__)

REPORT_TIMEOUT_S = 2.0  # a worker that does not answer a status request in time is left out of that answer
WATCH_EVERY_S = 0.25  # how often the engines' health is looked at


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What one front end has now, for the whole server's status and metrics."""

    pid: int = 0
    connections: int = 0
    contexts_active: int = 0
    contexts_paused: int = 0
    speech_requests: int = 0
    metrics: ServerMetrics = field(default_factory=ServerMetrics)


class WorkerPort(Protocol):
    """A front end as the coordinator sees it (all calls on the coordinator's loop; none may block)."""

    def granted(self, ticket_id: int, engine: int) -> None: ...

    def position(self, ticket_id: int, position: int) -> None: ...

    def refused(self, ticket_id: int) -> None:
        """No engine serves: the ticket will never be granted (its segment fails)."""
        ...

    def state(self, ready: bool, draining: bool) -> None: ...

    def spare(self, ticket_id: int, engine: int) -> None:
        """A slot on `engine` held for the worker's next segment, which claims it as ticket `ticket_id`."""
        ...

    def revoke(self, ticket_id: int) -> None:
        """Release spare `ticket_id` unless it is already claimed."""
        ...

    async def report(self) -> WorkerReport: ...


class EngineView(Protocol):
    def stats(self) -> EngineStats: ...


class Coordinator:
    def __init__(
        self, max_sessions: int, engines: Sequence[EngineView], slots: list[int], clients: ClientLimits | None = None
    ) -> None:
        self.max_sessions = max_sessions
        self.clients = clients or ClientLimits(0, 0.0)
        self.engines = list(engines)
        self.slots_per_engine = list(slots)
        # An engine still starting (or failed) takes no segment until it is healthy.
        self._healthy = [engine.stats().healthy for engine in self.engines]
        self._served = list(self._healthy)  # per engine: it has been healthy (an engine never healthy is starting)
        self.queue: SlotQueue[tuple[WorkerPort, int]] = SlotQueue(
            [n if healthy else 0 for n, healthy in zip(slots, self._healthy, strict=True)]
        )
        self.seats: dict[WorkerPort, Counter[str]] = {}  # per front end, its seats by client
        self.draining = False
        self._positions: dict[tuple[WorkerPort, int], int] = {}
        self._spared: list[WorkerPort] = []  # the front ends that hold spares, in the order they joined
        self._revoked: set[tuple[WorkerPort, int]] = set()  # spares called back, not yet released or claimed
        self._spare_ids = itertools.count(-1, -1)  # negative: a worker numbers its own tickets from 0 up
        self._watch: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def ready(self) -> bool:
        return not self.draining and any(self._healthy)

    @property
    def failed(self) -> bool:
        """Every engine served and has failed since: nothing queued would ever be served."""
        return all(self._served) and not any(self._healthy)

    @property
    def sessions(self) -> int:
        return sum(sum(seats.values()) for seats in self.seats.values())

    # -- front ends ------------------------------------------------------------------------------------------------

    def join(self, worker: WorkerPort, spares: bool = False) -> None:
        """`spares`: the worker holds a spare slot while there is room (one whose tickets cost a round trip)."""
        self.seats.setdefault(worker, Counter())
        worker.state(self.ready, self.draining)
        if spares:
            self._spared.append(worker)
            self._restock()

    def leave(self, worker: WorkerPort) -> None:
        """A front end is gone (closed, or its process died): its seats and tickets go back."""
        for client, count in self.seats.pop(worker, Counter()).items():
            for _ in range(count):
                self.clients.free(client)
        if worker in self._spared:
            self._spared.remove(worker)
        for key in [key for key in (*self.queue.holders, *self.queue.waiting) if key[0] is worker]:
            self._free(key)
        self._announce()
        self._restock()

    def take_seat(self, worker: WorkerPort, client: str) -> str | None:
        """A seat for a new session or speech request of `client` (its address); else why not: "draining",
        "unavailable", "starting", "full", or the client's own limits, "client_full" or "client_rate"."""
        if self.draining:
            return "draining"
        if self.failed:
            return "unavailable"
        if not self.ready:
            return "starting"
        if self.sessions >= self.max_sessions:
            return "full"
        if (refusal := self.clients.take(client, time.monotonic())) is not None:
            return refusal
        self.seats.setdefault(worker, Counter())[client] += 1
        return None

    def free_seat(self, worker: WorkerPort, client: str) -> None:
        seats = self.seats.get(worker)
        if seats is not None and seats[client] > 0:
            seats[client] -= 1
            self.clients.free(client)

    def enqueue(self, worker: WorkerPort, ticket_id: int, continuing: bool, avoid: int | None = None) -> None:
        """A segment wants an engine slot (on any engine but `avoid`): granted now (`worker.granted`), queued
        (`worker.position`), or refused when no engine serves (`worker.refused`): a queue nobody will ever serve would
        hold its segment until its client gave up."""
        if self.failed:
            worker.refused(ticket_id)
            return
        engine = self.queue.acquire((worker, ticket_id), continuing, avoid)
        if engine is not None:
            worker.granted(ticket_id, engine)
        else:
            self._revoke(self.queue.spares)
            self._announce()

    def claim(self, worker: WorkerPort, ticket_id: int) -> None:
        """The worker started a segment on its spare `ticket_id` (a ticket from now on, released as any other)."""
        key = (worker, ticket_id)
        self._revoked.discard(key)
        self.queue.claim(key)
        self._restock()

    def release(self, worker: WorkerPort, ticket_id: int) -> None:
        """A segment is done with its slot, or leaves the queue, or a spare comes back (idempotent)."""
        self._free((worker, ticket_id))
        self._announce()
        self._restock()

    def _free(self, key: tuple[WorkerPort, int]) -> None:
        self._revoked.discard(key)
        self._grant(self.queue.release(key))

    def _grant(self, grants: list[tuple[tuple[WorkerPort, int], int]]) -> None:
        for (worker, ticket_id), engine in grants:
            self._positions.pop((worker, ticket_id), None)
            worker.granted(ticket_id, engine)

    def _restock(self) -> None:
        """A spare for each front end that takes them and has none, while the queue allows (SlotQueue.spare)."""
        if len(self.engines) > 1:
            return
        held = {worker for worker, _ in self.queue.spares.keys() - self._revoked}
        for worker in self._spared:
            if worker in held:
                continue
            ticket_id = next(self._spare_ids)
            if (engine := self.queue.spare((worker, ticket_id))) is None:
                return
            worker.spare(ticket_id, engine)

    def _revoke(self, spares: dict[tuple[WorkerPort, int], int]) -> None:
        """Call back `spares` (those not called back already)."""
        for key in spares.keys() - self._revoked:
            self._revoked.add(key)
            key[0].revoke(key[1])

    def _announce(self) -> None:
        """Tell every waiting segment whose place in the queue changed (`queue.status`)."""
        waiting = self.queue.waiting
        alive = set(waiting)
        self._positions = {key: place for key, place in self._positions.items() if key in alive}
        for place, key in enumerate(waiting, start=1):
            if self._positions.get(key) != place:
                self._positions[key] = place
                key[0].position(key[1], place)

    # -- the server's life -----------------------------------------------------------------------------------------

    def drain(self) -> None:
        self.draining = True
        self._broadcast()

    def start(self) -> None:
        """Watch the engines' health from now on (on this event loop)."""
        self._watch = asyncio.get_running_loop().create_task(self._watch_engines())

    def stop(self) -> None:
        """Engines stopping from here on (the server is shutting down) are no news."""
        self._stopped = True
        if self._watch is not None:
            self._watch.cancel()

    async def _watch_engines(self) -> None:
        while True:
            self.check_engines()
            await asyncio.sleep(WATCH_EVERY_S)

    def check_engines(self) -> None:
        """An engine that failed (or a dead engine process) takes no more segments; the server stays ready while one
        serves."""
        healthy = [engine.stats().healthy for engine in self.engines]
        if healthy == self._healthy or self._stopped:
            return
        for index, (was, now) in enumerate(zip(self._healthy, healthy, strict=True)):
            if was != now:
                if now:
                    logger.info("engine %d serves", index)
                else:
                    logger.error("engine %d failed: it takes no more segments", index)
                self._grant(self.queue.set_capacity(index, self.slots_per_engine[index] if now else 0))
                if not now:
                    self._revoke({key: e for key, e in self.queue.spares.items() if e == index})
        self._healthy = healthy
        self._served = [served or now for served, now in zip(self._served, healthy, strict=True)]
        if self.failed:
            for key in self.queue.waiting:
                self.queue.release(key)
                key[0].refused(key[1])
        self._announce()
        self._broadcast()
        self._restock()

    def _broadcast(self) -> None:
        for worker in list(self.seats):
            worker.state(self.ready, self.draining)

    # -- the whole server ------------------------------------------------------------------------------------------

    async def reports(self) -> list[WorkerReport]:
        async def ask(worker: WorkerPort) -> WorkerReport | None:
            try:
                async with asyncio.timeout(REPORT_TIMEOUT_S):
                    return await worker.report()
            except (TimeoutError, ConnectionError, EOFError) as exc:
                logger.warning("a worker did not report: %r", exc)
                return None

        answers = await asyncio.gather(*(ask(worker) for worker in list(self.seats)))
        return [report for report in answers if report is not None]

    async def status(self) -> dict[str, Any]:
        reports = await self.reports()
        stats = [engine.stats() for engine in self.engines]
        generating, slots = sum(self.queue.generating), self.queue.slots
        return {
            "ready": self.ready,
            "draining": self.draining,
            "workers": len(reports),
            "worker_processes": [
                {"pid": r.pid, "connections": r.connections, "speech_requests": r.speech_requests} for r in reports
            ],
            "connections": {"active": sum(r.connections for r in reports), "max": self.max_sessions},
            "speech_requests": sum(r.speech_requests for r in reports),
            "contexts": {
                "active": sum(r.contexts_active for r in reports),
                "generating": generating,
                "queued": len(self.queue.waiting),
                "paused": sum(r.contexts_paused for r in reports),
            },
            "engine": _engine_totals(stats, slots),
            "engines": [
                _engine_figures(engine, capacity, generating, segments)
                for engine, capacity, generating, segments in zip(
                    self.engines, self.queue.capacity, self.queue.generating, self.queue.granted, strict=True
                )
            ],
            "utilisation_pct": round(100.0 * generating / slots, 1) if slots else 100.0,
            "can_accept": self.ready and self.sessions < self.max_sessions,
        }

    async def metrics(self) -> str:
        status = await self.status()
        metrics = ServerMetrics.merged([report.metrics for report in await self.reports()])
        engine = status["engine"]
        gauges = {
            "ttsws_sessions_active": status["connections"]["active"],
            "ttsws_speech_requests_active": status["speech_requests"],
            "ttsws_contexts_active": status["contexts"]["active"],
            "ttsws_contexts_queued": status["contexts"]["queued"],
            "ttsws_contexts_paused": status["contexts"]["paused"],
            "ttsws_engine_running": engine["running"],
            "ttsws_engine_waiting": engine["waiting"],
            "ttsws_engine_batch_size": engine["batch_size"],
            "ttsws_engine_step_seconds": engine["step_ms"] / 1000,
            "ttsws_engine_kv_blocks_free": engine["kv_blocks_free"],
            "ttsws_engines_healthy": sum(e["healthy"] for e in status["engines"]),
            "ttsws_workers": status["workers"],
        }
        steps = Histogram(STEP_BUCKETS_S)
        for stats in [engine.stats() for engine in self.engines]:
            steps.add(Histogram.of(STEP_BUCKETS_S, stats.step_counts, stats.step_s_total))
        return metrics.render(gauges, {"ttsws_engine_step_duration_seconds": steps})


def _engine_figures(engine: EngineView, slots: int, generating: int, segments: int) -> dict[str, Any]:
    """One engine's figures; the coordinator's: `generating`, the segments holding one of its slots now, and
    `segments`, how many it has been granted since the start."""
    stats = engine.stats()
    return {
        "pid": getattr(engine, "pid", os.getpid()),  # an engine process's, or this process's engine thread's
        "steps": stats.steps,
        "running": stats.running,
        "waiting": stats.waiting,
        "paused": stats.paused,
        "slots": slots,
        "generating": generating,
        "segments": segments,
        "step_ms": round(stats.step_ms_avg, 2),
        "batch_size": round(stats.batch_size_avg, 2),
        "kv_blocks_free": stats.kv_blocks_free,
        "healthy": stats.healthy,
    }


def _engine_totals(stats: list[EngineStats], slots: int) -> dict[str, Any]:
    """All engines as one: sums, the mean step time, healthy only if every engine is."""
    return {
        "running": sum(s.running for s in stats),
        "waiting": sum(s.waiting for s in stats),
        "paused": sum(s.paused for s in stats),
        "slots": slots,
        "step_ms": round(sum(s.step_ms_avg for s in stats) / len(stats), 2) if stats else 0.0,
        "batch_size": round(sum(s.batch_size_avg for s in stats), 2),
        "kv_blocks_free": sum(s.kv_blocks_free for s in stats),
        "healthy": all(s.healthy for s in stats),
    }
