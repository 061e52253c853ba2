"""A front end's line to the coordinator (wsserver.coordinator): seats, engine-slot tickets, the server's state, and
the whole server's status.

`LocalLink`: the coordinator lives in this process (a single-process server), calls are direct. `RemoteLink`: the
coordinator lives in the supervisor and a worker process talks to it over a Unix socket (engine.ipc messages);
`serve_coordinator` is the supervisor's end. Either way a ticket's grant comes as the engine's index, and a worker
whose link breaks has lost every seat and slot it held: the coordinator frees them when the connection closes.

Messages, worker -> coordinator: `("seat", call_id, client)` (answered `("reply", call_id, refusal | None)`),
`("free", client)`,
`("queue", ticket_id, continuing, avoid)`, `("claim", ticket_id)`, `("release", ticket_id)`, `("status", call_id)`,
`("metrics", call_id)`, `("report", call_id, WorkerReport)`; coordinator -> worker: `("granted", ticket_id, engine)`,
`("position", ticket_id, place)`, `("refused", ticket_id)`, `("spare", ticket_id, engine)`, `("revoke", ticket_id)`,
`("state", ready, draining)`, `("report?", call_id)`.

A RemoteLink's worker holds a spare slot while the server has room (wsserver.coordinator says how): a ticket it asks
for then is granted at once, and the claim goes to the coordinator behind it.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from engine import EngineError, ipc
from wsserver.coordinator import Coordinator, WorkerReport

logger = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class SlotTicket:
    """One segment's place in the slot queue (a WebSocket context's or a speech request's)."""

    id: int
    on_position: Callable[[int], None]  # told its place in the queue whenever it changes
    granted: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CoordinatorLink(abc.ABC):
    """What a front end holds. `report` is the front end's own figures, asked for when someone wants the status."""

    def __init__(self, report: Callable[[], WorkerReport]) -> None:
        self.own_report = report
        self.ready = False
        self.draining = False
        self._tickets: dict[int, SlotTicket] = {}
        self._ids = itertools.count()
        self._spare: tuple[int, int] | None = None  # (ticket id, engine): a slot the coordinator holds for us

    @abc.abstractmethod
    async def take_seat(self, client: str) -> str | None:
        """A seat for a session or speech request of `client` (its address); else why not (Coordinator.take_seat)."""

    @abc.abstractmethod
    def free_seat(self, client: str) -> None: ...

    def queue(self, on_position: Callable[[int], None], continuing: bool, avoid: int | None = None) -> SlotTicket:
        """A ticket for an engine slot (on any engine but `avoid`); its `granted` future gives the engine. Every
        ticket goes back with `release`."""
        if self._spare is not None and self._spare[1] != avoid:
            (ticket_id, engine), self._spare = self._spare, None
            ticket = SlotTicket(ticket_id, on_position)
            ticket.granted.set_result(engine)
            self._tickets[ticket_id] = ticket
            self._claim(ticket_id)
            return ticket
        ticket = SlotTicket(next(self._ids), on_position)
        self._tickets[ticket.id] = ticket
        self._enqueue(ticket.id, continuing, avoid)
        return ticket

    def release(self, ticket: SlotTicket) -> None:
        """Idempotent: the slot, or the place in the queue, goes back."""
        if self._tickets.pop(ticket.id, None) is not None:
            self._release(ticket.id)

    @abc.abstractmethod
    def _enqueue(self, ticket_id: int, continuing: bool, avoid: int | None) -> None: ...

    @abc.abstractmethod
    def _claim(self, ticket_id: int) -> None:
        """Tell the coordinator that spare `ticket_id` is a segment's now."""

    @abc.abstractmethod
    def _release(self, ticket_id: int) -> None: ...

    @abc.abstractmethod
    async def status(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    async def metrics(self) -> str: ...

    # from the coordinator

    def granted(self, ticket_id: int, engine: int) -> None:
        ticket = self._tickets.get(ticket_id)
        if ticket is not None and not ticket.granted.done():
            ticket.granted.set_result(engine)

    def position(self, ticket_id: int, place: int) -> None:
        ticket = self._tickets.get(ticket_id)
        if ticket is not None and not ticket.granted.done():
            ticket.on_position(place)

    def refused(self, ticket_id: int) -> None:
        ticket = self._tickets.get(ticket_id)
        if ticket is not None and not ticket.granted.done():
            ticket.granted.set_exception(EngineError("no engine is serving: every engine has failed"))

    def spare(self, ticket_id: int, engine: int) -> None:
        self._spare = (ticket_id, engine)

    def revoke(self, ticket_id: int) -> None:
        if self._spare is not None and self._spare[0] == ticket_id:
            self._spare = None
            self._release(ticket_id)

    def state(self, ready: bool, draining: bool) -> None:
        self.ready, self.draining = ready, draining


class LocalLink(CoordinatorLink):
    """The coordinator in this process: a ticket is granted within the call, so this link holds no spare."""

    def __init__(self, coordinator: Coordinator, report: Callable[[], WorkerReport]) -> None:
        super().__init__(report)
        self.coordinator = coordinator
        coordinator.join(self)

    async def take_seat(self, client: str) -> str | None:
        return self.coordinator.take_seat(self, client)

    def free_seat(self, client: str) -> None:
        self.coordinator.free_seat(self, client)

    def _enqueue(self, ticket_id: int, continuing: bool, avoid: int | None) -> None:
        self.coordinator.enqueue(self, ticket_id, continuing, avoid)

    def _claim(self, ticket_id: int) -> None:
        self.coordinator.claim(self, ticket_id)

    def _release(self, ticket_id: int) -> None:
        self.coordinator.release(self, ticket_id)

    async def report(self) -> WorkerReport:
        return self.own_report()

    async def status(self) -> dict[str, Any]:
        return await self.coordinator.status()

    async def metrics(self) -> str:
        return await self.coordinator.metrics()


class RemoteLink(CoordinatorLink):
    """The coordinator in the supervisor, over a Unix socket."""

    def __init__(self, connection: ipc.Receiver, report: Callable[[], WorkerReport]) -> None:
        super().__init__(report)
        self._connection = connection
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self.lost = asyncio.get_running_loop().create_future()  # done when the coordinator is gone
        self._closing = False  # this end closed the connection (a drained worker's exit), not the coordinator
        connection.hand_to(self._received)
        connection.closed.add_done_callback(self._gone)

    @classmethod
    async def connect(cls, path: str, report: Callable[[], WorkerReport]) -> RemoteLink:
        return cls(await ipc.connect(path), report)

    async def close(self) -> None:
        self._closing = True
        self._connection.close()
        await self._connection.closed

    def _send(self, *message: Any) -> None:
        self._connection.send(message)

    async def _call(self, kind: str, *args: Any) -> Any:
        if self.lost.done():
            raise ConnectionError("the coordinator is gone")
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._send(kind, call_id, *args)
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def take_seat(self, client: str) -> str | None:
        try:
            return await self._call("seat", client)
        except ConnectionError:
            return "draining"

    def free_seat(self, client: str) -> None:
        self._send("free", client)

    def _enqueue(self, ticket_id: int, continuing: bool, avoid: int | None) -> None:
        self._send("queue", ticket_id, continuing, avoid)

    def _claim(self, ticket_id: int) -> None:
        self._send("claim", ticket_id)

    def _release(self, ticket_id: int) -> None:
        self._send("release", ticket_id)

    async def status(self) -> dict[str, Any]:
        return await self._call("status")

    async def metrics(self) -> str:
        return await self._call("metrics")

    def _received(self, message: tuple[Any, ...]) -> None:
        kind, *args = message
        if kind == "reply":
            call_id, result = args
            if (future := self._calls.get(call_id)) is not None and not future.done():
                future.set_result(result)
        elif kind == "granted":
            self.granted(*args)
        elif kind == "position":
            self.position(*args)
        elif kind == "refused":
            self.refused(*args)
        elif kind == "spare":
            self.spare(*args)
        elif kind == "revoke":
            self.revoke(*args)
        elif kind == "state":
            self.state(*args)
        elif kind == "report?":
            self._send("report", args[0], self.own_report())

    def _gone(self, closed: asyncio.Future[BaseException | None]) -> None:
        if self._closing:
            logger.info("coordinator connection closed")
        else:
            logger.error("coordinator connection lost: %s", closed.result() or "closed")
        self.state(False, True)  # without the coordinator nothing new can start: the worker drains
        self._spare = None  # its slot went with the coordinator
        for future in self._calls.values():
            if not future.done():
                future.set_exception(ConnectionError("the coordinator is gone"))
        if not self.lost.done():
            self.lost.set_result(None)


class _RemoteWorker(ipc.Receiver):
    """The coordinator's end of one worker's connection (a WorkerPort): it joins the coordinator once connected and
    leaves it, its seats and tickets going back, once the connection ends."""

    def __init__(self, coordinator: Coordinator) -> None:
        super().__init__(self._received)
        self.coordinator = coordinator
        self._reports: dict[int, asyncio.Future[WorkerReport]] = {}
        self._ids = itertools.count()
        self._answering: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.coordinator.join(self, spares=True)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for future in self._reports.values():
            if not future.done():
                future.set_exception(ConnectionError("the worker is gone"))
        self.coordinator.leave(self)

    def _received(self, message: tuple[Any, ...]) -> None:
        kind, *args = message
        coordinator = self.coordinator
        if kind == "seat":
            call_id, client = args
            self.send(("reply", call_id, coordinator.take_seat(self, client)))
        elif kind == "free":
            coordinator.free_seat(self, *args)
        elif kind == "queue":
            coordinator.enqueue(self, *args)
        elif kind == "claim":
            coordinator.claim(self, *args)
        elif kind == "release":
            coordinator.release(self, *args)
        elif kind == "status":
            self._answer(args[0], coordinator.status())
        elif kind == "metrics":
            self._answer(args[0], coordinator.metrics())
        elif kind == "report":
            call_id, report = args
            if (future := self._reports.get(call_id)) is not None and not future.done():
                future.set_result(report)

    def _answer(self, call_id: int, work: Awaitable[Any]) -> None:
        async def reply() -> None:
            self.send(("reply", call_id, await work))

        task = asyncio.create_task(reply())
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    # WorkerPort

    def granted(self, ticket_id: int, engine: int) -> None:
        self.send(("granted", ticket_id, engine))

    def position(self, ticket_id: int, place: int) -> None:
        self.send(("position", ticket_id, place))

    def refused(self, ticket_id: int) -> None:
        self.send(("refused", ticket_id))

    def spare(self, ticket_id: int, engine: int) -> None:
        self.send(("spare", ticket_id, engine))

    def revoke(self, ticket_id: int) -> None:
        self.send(("revoke", ticket_id))

    def state(self, ready: bool, draining: bool) -> None:
        self.send(("state", ready, draining))

    async def report(self) -> WorkerReport:
        call_id = next(self._ids)
        future: asyncio.Future[WorkerReport] = asyncio.get_running_loop().create_future()
        self._reports[call_id] = future
        self.send(("report?", call_id))
        try:
            return await future
        finally:
            self._reports.pop(call_id, None)


async def serve_coordinator(coordinator: Coordinator, path: str) -> asyncio.AbstractServer:
    """The supervisor's end: every worker's connection, dispatched to `coordinator`."""
    return await ipc.serve(path, lambda: _RemoteWorker(coordinator))
