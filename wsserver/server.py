"""The I/O adapter: websockets (asyncio) in front of the sans-I/O `Session`, the engine behind it.

Per connection, two tasks, one per segment in flight, and a timer:
- the reader feeds client frames to the session;
- the writer pulls the session's outgoing frames one at a time and awaits each send, so a client that does not
  read stops the writer, the session's queue fills, its segment tasks stop pulling engine audio (the engine then
  pauses those requests), and the session's stall timer closes the connection (4408); other connections never wait;
- a segment task waits for an engine slot in the shared FIFO, then streams the engine's chunks into the session;
- the timer (a loop callback, not a task) calls `session.tick()` at the session's next deadline (segmenter waits,
  idle and stall timeouts).
After every input the adapter runs the session's actions (`pump`), which also re-arms the timer.

Timeouts use `asyncio.timeout`, never `asyncio.wait_for`, and the timer is a callback, not a task: on Python 3.11
`wait_for` swallows a cancellation that arrives as the awaited operation completes (cpython gh-86296, fixed in 3.12).
A timer task sleeping in `wait_for` whose wake-up met the socket's end ignored its cancellation and slept on with no
deadline: the connection's handler never returned, and the server's close, which waits for every handler, hung
SIGTERM (issue 17).

Every close is bounded for a client that does not read: websockets waits for the socket to drain with no timeout
(its close timeout starts only once the close frame is out), so neither a send nor the close handshake is left to
it. Output queued or in flight at a close obeys the session's stall rule (the close is forced after
`stall_timeout_s` without progress); the handshake after the output gets `stall_timeout_s`, a forced close
`ABORT_CLOSE_S`; then the transport is aborted. So a session never outlives a client that stopped reading by more
than `stall_timeout_s + ABORT_CLOSE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import uvicorn
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from engine import EngineError
from engine.streams import EngineHandle
from wsserver.access import Caller, check_key, check_origin
from wsserver.app import make_app
from wsserver.config import ServerConfig
from wsserver.continuity import Continuity
from wsserver.coordinator import Coordinator, WorkerReport
from wsserver.errors import CloseCode
from wsserver.handoff import Receiver
from wsserver.http import RETRY_AFTER_S, ApiError, over_capacity
from wsserver.link import CoordinatorLink, LocalLink, SlotTicket
from wsserver.loras import LoRAs
from wsserver.metrics import ServerMetrics
from wsserver.opus_load import OpusComplexity
from wsserver.protocol import AbortSegment, CloseConnection, RunSegment, Session, SessionConfig
from wsserver.voices import VoiceStore
from wsserver.websocket import Upgrades

logger = logging.getLogger(__name__)

ATTACH_WAIT_S = 10.0  # how long a worker still connecting to the engines holds a new session
ABORT_CLOSE_S = 1.0  # a forced close (the client read nothing for stall_timeout_s) tries the handshake this long


async def _going_away(websocket: ServerConnection) -> None:
    try:
        async with asyncio.timeout(ABORT_CLOSE_S):
            await websocket.close(CloseCode.GOING_AWAY, "server closing")
    except TimeoutError:
        websocket.transport.abort()


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: SIGTERM drains the sessions first (wsserver.__main__), then closes it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def adopt(self, sock: socket.socket) -> asyncio.BaseTransport:
        """Serve a connection accepted elsewhere (the supervisor's deal) as if our own listener had accepted it."""
        config = self.config

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(protocol, sock)
        return transport


class TTSServer:
    """One front end: HTTP and WebSocket sessions on a listening socket, in front of the engines, with its seats and
    slot tickets from the coordinator (its own, in a single-process server, or the supervisor's)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = ServerMetrics()  # this front end's; the coordinator adds every front end's up
        # Its Opus streams' complexity, lowered while its loop is short of CPU; it counts their frames by complexity.
        self.opus_complexity = OpusComplexity(
            config.opus_complexity, config.opus_min_complexity, counts=self.metrics.opus_frames
        )
        self.engines: list[EngineHandle] = []
        self.voices: VoiceStore | None = None
        self.link: CoordinatorLink | None = None
        self.connections: set[Connection] = set()
        self.speeches: set[asyncio.Task[None]] = set()  # speech requests generating (wsserver.speech)
        self.draining = False  # this front end drains (SIGTERM)
        self._coordinator: Coordinator | None = None  # a single-process server's own
        self._attached = asyncio.Event()  # the engines are connected (attach)
        self._upgrades: Upgrades | None = None  # made in listen(): websockets wants a running loop
        self._uvicorn: _Uvicorn | None = None
        self._serving: asyncio.Task[None] | None = None
        self._receiver: Receiver | None = None  # a worker's: the connections the supervisor deals (serve_dealt)

    @property
    def engine(self) -> EngineHandle | None:
        """The engine that answers for the model (info, voice encoding): the first (every engine serves the same)."""
        return self.engines[0] if self.engines else None

    @property
    def ready(self) -> bool:
        return bool(self.engines) and self.link is not None and self.link.ready and not self.draining

    @property
    def alive(self) -> bool:
        """False once every engine has failed: this server can never serve again (the liveness probe's answer)."""
        return not self.engines or any(engine.stats().healthy for engine in self.engines)

    def can_move(self, engine: EngineHandle, moves: int) -> bool:
        """Whether a segment that `engine` failed before its first chunk may run again on another engine: nothing of it
        reached the client, so it loses nothing by moving, where failing would end its context. In the 2-GPU kill run
        the dead engine held 256 segments but was stepping 2: most had just been granted at a segment boundary. A
        segment moves at most once per engine: should the coordinator still route to an engine only this worker lost,
        it fails instead of moving in circles."""
        others = (other for other in self.engines if other is not engine)
        return moves < len(self.engines) and not engine.stats().healthy and any(o.stats().healthy for o in others)

    @property
    def state(self) -> str:
        """What /ready says: "starting" (the model loads), "ready", "draining" (SIGTERM), or "failed" (every engine
        has failed: the server can no longer serve, and a supervisor should replace it)."""
        if self.draining:
            return "draining"
        if self.ready:
            return "ready"
        return "starting" if self.alive else "failed"

    def attach(self, engines: list[EngineHandle], voices: VoiceStore, link: CoordinatorLink | None = None) -> None:
        """The engines are warm: start accepting sessions. Without a link the server coordinates itself (one process:
        seats and slots are its own)."""
        self.engines, self.voices = engines, voices
        self._attached.set()
        if link is None:
            slots = [min(self.config.max_num_seqs, engine.stats().max_num_seqs) for engine in engines]
            self._coordinator = Coordinator(self.config.max_connections, engines, slots, self.config.client_limits())
            self._coordinator.start()
            link = LocalLink(self._coordinator, self.report)
        self.link = link

    def report(self) -> WorkerReport:
        """This front end's figures, for the whole server's status."""
        return WorkerReport(
            pid=os.getpid(),
            connections=len(self.connections),
            contexts_active=sum(len(c.session.contexts) for c in self.connections),
            contexts_paused=sum(c.paused for c in self.connections),
            speech_requests=len(self.speeches),
            metrics=self.metrics,
        )

    def caller(self, headers: Mapping[str, str], query: str, peer: str | None) -> Caller:
        return Caller.of(headers, query, peer, self.config.trusted_proxies)

    def authorize(self, caller: Caller, admin: bool = False) -> ApiError | None:
        """Whether the caller may use the server (the API key, the page's origin); `admin`: may change its state (the
        admin key, when one is set)."""
        config = self.config
        refusal = check_origin(caller, config.allowed_origins, keyed=config.api_key is not None)
        if refusal is None and admin and config.admin_key is not None:
            return check_key(caller, config.admin_key, "changing the server's voices or LoRA adapters")
        return refusal or check_key(caller, config.api_key)

    async def admit(self, caller: Caller) -> ApiError | None:
        """A seat for a new session or speech request (give it back with `free_seat`), or why not: the key and
        origin, the server's state, room under `max_connections` (server-wide) and the client's own limits."""
        if (refusal := self.authorize(caller)) is not None:
            return refusal
        if self.draining:
            return over_capacity("draining")
        if self.link is not None and self.link.ready and not self.engines:
            # The engines serve, but this worker is still connecting to them (another worker got there first, or this
            # one was just restarted): hold the request that long rather than refuse it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ATTACH_WAIT_S):
                    await self._attached.wait()
        if self.link is None or not self.engines:
            return over_capacity("starting")
        reason = await self.link.take_seat(caller.address)
        config = self.config
        if reason is None:
            return None
        if reason == "client_full":
            message = f"this client holds max_connections_per_client={config.max_connections_per_client} already"
            return ApiError(429, "too_many_connections", message, Retry_After=str(RETRY_AFTER_S))
        if reason == "client_rate":
            message = f"over handshakes_per_client_s={config.handshakes_per_client_s} for this client"
            return ApiError(429, "rate_limited", message, Retry_After="1")
        if reason == "full":
            reason = f"max_connections={config.max_connections} sessions and requests are open"
        return over_capacity(reason)

    def free_seat(self, caller: Caller) -> None:
        assert self.link is not None
        self.link.free_seat(caller.address)

    async def status(self) -> dict[str, Any]:
        if self.link is None:
            return {"ready": False, "draining": self.draining, "can_accept": False}
        status = await self.link.status()
        return status | {"ready": status["ready"] and not self.draining}

    async def render_metrics(self) -> str:
        assert self.link is not None
        return await self.link.metrics()

    async def listen(self, sock: socket.socket | None = None) -> socket.socket:
        """Serve HTTP and WebSocket sessions on `sock` (default: bind the configured address); returns the socket."""
        if sock is None:
            sock = socket.create_server((self.config.bind_host, self.config.port), backlog=2048)
        self._bound_send_buffer(sock)  # accepted sockets inherit it
        await self._start_uvicorn([sock])
        return sock

    async def serve_dealt(self, channel: socket.socket) -> None:
        """Serve the connections the supervisor deals over `channel` (wsserver.handoff) instead of a listening
        socket of our own."""
        await self._start_uvicorn([])
        self._receiver = Receiver(channel, self._adopt)
        self._receiver.start()

    async def _adopt(self, conn: socket.socket) -> asyncio.BaseTransport:
        assert self._uvicorn is not None
        self._bound_send_buffer(conn)
        return await self._uvicorn.adopt(conn)

    def _bound_send_buffer(self, sock: socket.socket) -> None:
        """Bound the kernel's share of a connection's send buffer (autotuning would grow it to megabytes): a client
        that does not read then stalls its sender after a known amount of audio."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.limits.send_buffer_bytes)

    async def _start_uvicorn(self, sockets: list[socket.socket]) -> None:
        self._upgrades = Upgrades(self)
        config = uvicorn.Config(
            make_app(self),
            ws=self._upgrades.protocol_factory(),
            http="httptools",
            lifespan="off",
            log_config=None,
            access_log=False,
            # The drain (below) bounds in-flight work; uvicorn then only closes idle keep-alive connections.
            timeout_graceful_shutdown=ABORT_CLOSE_S,
        )
        self._uvicorn = _Uvicorn(config)
        self._serving = asyncio.create_task(self._uvicorn.serve(sockets=sockets))
        while not self._uvicorn.started:
            if self._serving.done():
                self._serving.result()  # startup failed: raise its error
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Stop listening, close idle HTTP connections, and close the sessions still open with 1001 (going away):
        after `drain` none are left but those of clients that never read."""
        if self._uvicorn is None or self._serving is None or self._upgrades is None:
            return
        if self._receiver is not None:
            self._receiver.close()  # the supervisor deals new connections to the other workers
        self._uvicorn.should_exit = True
        await self._serving
        await asyncio.gather(*(_going_away(websocket) for websocket in list(self._upgrades.all_connections)))
        await asyncio.gather(*self._upgrades.handler_tasks, return_exceptions=True)
        if self._coordinator is not None:
            self._coordinator.stop()

    async def drain(self) -> None:
        """SIGTERM: /ready turns 503, sessions are told, open contexts get `drain_timeout_s` to finish, the rest are
        cancelled (each with `context.cancelled`), and every session is closed with 4503."""
        self.draining = True
        for connection in list(self.connections):
            connection.session.drain(time.monotonic())
            connection.pump()
        deadline = time.monotonic() + self.config.drain_timeout_s
        while (self.connections or self.speeches) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.session.drain_expired(time.monotonic())
            connection.pump()
        for speech in list(self.speeches):
            speech.cancel()
        deadline = time.monotonic() + ABORT_CLOSE_S + 1
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.close()

    async def handle(self, websocket: ServerConnection) -> None:
        """One WebSocket session (its seat was taken at the handshake), from the handshake to the connection's end."""
        connection = Connection(self, websocket)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)


class Connection:
    def __init__(self, server: TTSServer, websocket: ServerConnection) -> None:
        assert server.engine is not None and server.voices is not None and server.link is not None
        self.server = server
        self.link = server.link
        self.websocket = websocket
        info = server.engine.info
        self.session = Session(
            SessionConfig(
                uuid.uuid4().hex,
                info,
                server.voices,
                server.config.limits,
                loras=LoRAs(server.engines),
                opus_complexity=server.opus_complexity,
            ),
            server.metrics,
            time.monotonic(),
        )
        self.segments: dict[str, tuple[asyncio.Task[None], SlotTicket]] = {}  # ctx -> its segment task and ticket
        self.continuity: dict[str, Continuity] = {}  # ctx -> what its next segment continues
        self.paused = 0  # segment tasks waiting for the client to read
        self._wake_writer = asyncio.Event()  # the outbox may have something
        self._writable = asyncio.Event()  # the outbox is below its high-water mark
        self._timer: asyncio.TimerHandle | None = None  # calls session.tick() at `_armed`
        self._armed: float | None = None  # the session deadline the timer is set for
        self._close_after_output: CloseConnection | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        self._tasks = [asyncio.create_task(self._write())]
        self.pump()
        try:
            async for data in self.websocket:
                self.session.receive(data, time.monotonic())
                self.pump()
        except ConnectionClosed:
            pass
        finally:
            self.session.connection_lost()
            self.pump()
            segments = list(self.segments.values())
            for task in [*self._tasks, *(task for task, _ in segments)]:
                task.cancel()
            for _, ticket in segments:  # a task cancelled before it ran would never release its slot itself
                self.link.release(ticket)
            await asyncio.gather(*self._tasks, *(task for task, _ in segments), return_exceptions=True)
            if self._timer is not None:
                self._timer.cancel()

    def pump(self) -> None:
        """Carry out what the session asked for, wake the writer, and arm the timer for the session's next deadline."""
        for action in self.session.actions():
            match action:
                case RunSegment():
                    self._start(action)
                case AbortSegment(ctx=ctx):
                    if ctx in self.segments:
                        task, ticket = self.segments.pop(ctx)
                        task.cancel()  # leaving the engine's iterator aborts the request at its next step
                        self.link.release(ticket)
                    self.continuity.pop(ctx, None)
                case CloseConnection(after_output=True):
                    self._close_after_output = action
                case CloseConnection():
                    self._tasks.append(asyncio.create_task(self._abort(action)))
        self._wake_writer.set()
        deadline = self.session.next_deadline()
        if deadline is not None and (self._armed is None or deadline < self._armed):
            # Earlier than the timer is set for (a later deadline just makes it fire early and re-arm).
            if self._timer is not None:
                self._timer.cancel()
            self._armed = deadline
            self._timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), self._on_timer)

    def _start(self, action: RunSegment) -> None:
        if action.segment == 0:
            info = self.server.engines[0].info
            self.continuity[action.ctx] = Continuity(
                action.voice, info, self.server.config.carry_s, action.instruction, action.language
            )
        # Queue for a slot now, not when the task first runs: a continuation must be in the queue before the slot
        # its previous segment frees is handed on.
        ticket = self.link.queue(functools.partial(self._queued, action.ctx), action.continuing)
        task = asyncio.create_task(self._generate(action, ticket, self.continuity[action.ctx]))
        self.segments[action.ctx] = (task, ticket)

    def _queued(self, ctx: str, position: int) -> None:
        self.session.queue_position(ctx, position, time.monotonic())
        self.pump()

    async def _generate(self, action: RunSegment, ticket: SlotTicket, continuity: Continuity) -> None:
        session, now = self.session, time.monotonic
        max_patches = self.server.config.max_patches
        request = continuity.request(action.text, action.generation, action.segment, max_patches, action.lora)
        try:
            index = await ticket.granted  # the engine whose slot it got
            engine = self.server.engines[index]
            session.segment_admitted(action.ctx, now())
            self.pump()
            latents = []
            moves = 0
            while True:
                try:
                    # aclosing: leaving the loop (a cancel while waiting for the client) closes the stream, which
                    # cancels the request now; left to the garbage collector, the request would stay paused meanwhile.
                    async with contextlib.aclosing(engine.generate(request)) as chunks:
                        async for chunk in chunks:
                            latents.append(chunk.latents)
                            session.segment_audio(action.ctx, chunk.samples, now())
                            self.pump()
                            await self._until_writable()
                    break
                except EngineError as exc:
                    if latents or not self.server.can_move(engine, moves):
                        raise
                    moves += 1
                    logger.warning("segment %d of %r moves to another engine: %s", action.segment, action.ctx, exc)
                    ticket = self._requeue(action.ctx, ticket, avoid=index)
                    index = await ticket.granted
                    engine = self.server.engines[index]
            continuity.record(action.text, latents)
            session.segment_finished(action.ctx, now())
        except EngineError as exc:
            logger.warning("segment %d of context %r failed: %s", action.segment, action.ctx, exc)
            session.segment_failed(action.ctx, f"engine: {exc}", now())
        finally:
            if action.ctx in self.segments and self.segments[action.ctx][1] is ticket:
                del self.segments[action.ctx]
            self.pump()  # may start this context's next segment, which then queues ahead of new contexts
            self.link.release(ticket)
            if action.ctx not in session.contexts:
                self.continuity.pop(action.ctx, None)

    def _requeue(self, ctx: str, ticket: SlotTicket, avoid: int) -> SlotTicket:
        """Give back `ticket`'s slot on dead engine `avoid` and queue again for one elsewhere, ahead of new contexts."""
        self.link.release(ticket)
        ticket = self.link.queue(functools.partial(self._queued, ctx), continuing=True, avoid=avoid)
        if ctx in self.segments:
            self.segments[ctx] = (self.segments[ctx][0], ticket)
        return ticket

    async def _until_writable(self) -> None:
        """Hold a segment while its client lags: not pulling chunks makes the engine pause the request."""
        if self.session.writable:
            return
        self.paused += 1
        try:
            while not self.session.writable:
                self._writable.clear()
                await self._writable.wait()
        finally:
            self.paused -= 1

    async def _write(self) -> None:
        try:
            while True:
                item = self.session.next_outgoing(time.monotonic())
                if item is None:
                    if self._close_after_output is not None:
                        # Nothing is queued now, so the session's stall rule no longer watches: bound the handshake
                        # by the same timeout.
                        await self._close(self._close_after_output, self.session.config.limits.stall_timeout_s)
                        return
                    self._wake_writer.clear()
                    await self._wake_writer.wait()
                    continue
                await self.websocket.send(item.data, text=item.text)
                if self.session.writable:
                    self._writable.set()
                if item.ends_turn:
                    # The other sessions' writers now: a step's chunks reach many sessions at once, and each writer
                    # encodes its Opus frames as it sends them (OpusFrame), so a session's first frames wait only
                    # for the few frames each session before it sends to hold TURN_CUSHION_S, not for every chunk.
                    await asyncio.sleep(0)
        except ConnectionClosed:
            pass

    def _on_timer(self) -> None:
        self._timer = self._armed = None
        self.session.tick(time.monotonic())
        self.pump()

    async def _abort(self, action: CloseConnection) -> None:
        """Close a connection whose client reads nothing: its close handshake cannot complete, so cut it short."""
        logger.info("closing session %s: %s", self.session.config.session_id, action.reason)
        self._tasks[0].cancel()  # the writer is stuck in a send
        await self._close(action, ABORT_CLOSE_S)

    async def _close(self, action: CloseConnection, timeout: float) -> None:
        """The close handshake, or an aborted transport when it does not complete within `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                await self.websocket.close(action.code, action.reason)
        except TimeoutError:
            self.websocket.transport.abort()
