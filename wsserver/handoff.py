"""New connections dealt to the front-end workers by the supervisor: the port has one listening socket, in the
supervisor, and each accepted connection goes to the worker with the fewest open ones, its descriptor passed over
that worker's channel (a Unix SOCK_SEQPACKET pair; SCM_RIGHTS).

Why not a SO_REUSEPORT group, one socket per worker: the kernel picks a socket by a hash of the connection's
addresses, which spreads a burst at random, not evenly. At 512 Opus sessions on 14 workers (one H200 host,
2026-11-28) the busiest worker held about 1.3x the mean, as 512 random draws over 14 bins do, and ran at 94 % of a
core while the mean was 74 %: its sessions starved first. (One socket that every worker accepted on was worse:
whichever worker woke first took a whole burst.)

Channel messages. Supervisor -> worker: one byte and one descriptor per connection. Worker -> supervisor: a 4-byte
count of connections that closed since its last message (the worker sweeps its connections every `SWEEP_S`), so the
supervisor's count of a worker's open connections is what it dealt less what came back. The end of a channel (the
worker exited or died) takes the worker out of the deal until it is started again with a new channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ACCEPT_RETRY_S = 0.1  # after a failed accept (out of descriptors): a moment for connections to close
SWEEP_S = 0.1  # how often a worker counts its closed connections (the deal's view of them lags by at most this)
_COUNT = struct.Struct("!I")


@dataclass(slots=True)
class _Channel:
    index: int  # the worker's
    sock: socket.socket  # the supervisor's end
    open: int = 0  # connections dealt to the worker and not reported closed
    dealt: int = 0  # all connections dealt to it (ties go to the worker dealt fewest: turns)


class Dealer:
    """The supervisor's side: accepts on `listener` and deals each connection to a worker (the only owner of the
    channels and of their counts; all on the supervisor's loop)."""

    def __init__(self, listener: socket.socket) -> None:
        listener.setblocking(False)
        self.listener = listener
        self._channels: dict[int, _Channel] = {}
        self._task: asyncio.Task[None] | None = None

    def open_counts(self) -> dict[int, int]:
        """Per worker index (those with a channel), its connections open as far as the deal knows."""
        return {index: channel.open for index, channel in self._channels.items()}

    def attach(self, index: int) -> socket.socket:
        """A new channel for worker `index` (replacing a dead one's): returns the worker's end, to hand to its
        process and then close here."""
        self._detach(index)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        channel = _Channel(index, ours)
        self._channels[index] = channel
        asyncio.get_running_loop().add_reader(ours, self._readable, channel)
        return theirs

    def start(self) -> None:
        self._task = asyncio.create_task(self._accept())

    async def close(self) -> None:
        """Stop accepting (new connections are then refused) and let go of every channel."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for index in list(self._channels):
            self._detach(index)
        self.listener.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.listener)
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: out of descriptors or memory for now; the backlog waits
                logger.error("accepting a connection failed: %r", exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            with conn:
                self.deal(conn)

    def deal(self, conn: socket.socket) -> bool:
        """Pass `conn` to the worker with the fewest open connections that takes it; False if none does (the
        connection is then closed by the caller: a client connects again)."""
        for channel in sorted(self._channels.values(), key=lambda c: (c.open, c.dealt, c.index)):
            try:
                socket.send_fds(channel.sock, [b"c"], [conn.fileno()])
            except BlockingIOError:
                continue  # a worker that has not read its channel for a while (busy or stuck): the next one
            except (BrokenPipeError, ConnectionResetError):
                self._detach(channel.index)  # its process is gone
                continue
            except OSError as exc:  # e.g. ETOOMANYREFS: descriptors in flight beyond the open-files limit
                logger.warning("dealing a connection to worker %d failed: %r", channel.index, exc)
                continue
            channel.open += 1
            channel.dealt += 1
            return True
        logger.warning("no worker took a new connection: closed")
        return False

    def _readable(self, channel: _Channel) -> None:
        while True:
            try:
                message = channel.sock.recv(_COUNT.size)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:  # the worker's end closed: it exited or died
                self._detach(channel.index)
                return
            channel.open = max(0, channel.open - _COUNT.unpack(message)[0])

    def _detach(self, index: int) -> None:
        channel = self._channels.pop(index, None)
        if channel is not None:
            asyncio.get_running_loop().remove_reader(channel.sock)
            channel.sock.close()


class Receiver:
    """A worker's side: adopts the connections its channel brings (`adopt` serves one and returns its transport) and
    reports those that closed. Runs on the worker's loop; `close` stops it (the supervisor then deals to others)."""

    def __init__(self, channel: socket.socket, adopt: Callable[[socket.socket], Awaitable[asyncio.BaseTransport]]):
        channel.setblocking(False)
        self.channel = channel
        self.adopt = adopt
        self._open: set[asyncio.BaseTransport] = set()
        self._unreported = 0  # closed connections not yet told to the supervisor
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    def start(self) -> None:
        asyncio.get_running_loop().add_reader(self.channel, self._readable)
        self._spawn(self._sweep())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        asyncio.get_running_loop().remove_reader(self.channel)
        for task in self._tasks:
            task.cancel()
        self.channel.close()

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _readable(self) -> None:
        while not self.closed:
            try:
                message, fds, _, _ = socket.recv_fds(self.channel, 1, 1)
            except BlockingIOError:
                return
            except OSError:
                message, fds = b"", []
            if not message and not fds:  # the supervisor is gone; the coordinator's loss drains this worker
                self.close()
                return
            for fd in fds:
                self._spawn(self._take(socket.socket(fileno=fd)))

    async def _take(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        try:
            transport = await self.adopt(conn)
        except Exception:
            logger.exception("a dealt connection could not be served")
            conn.close()
            self._unreported += 1
            return
        self._open.add(transport)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            closed = [transport for transport in self._open if transport.is_closing()]
            self._open.difference_update(closed)
            self._unreported += len(closed)
            if not self._unreported:
                continue
            try:
                self.channel.send(_COUNT.pack(self._unreported))
            except BlockingIOError:
                continue  # told at the next sweep
            except OSError:
                return
            self._unreported = 0
