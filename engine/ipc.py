"""Messages between the processes of one server: pickled objects, length-prefixed, over Unix stream sockets.

Only processes of the same server talk this way, through sockets in a directory only its user can enter (the
supervisor makes it), so unpickling what arrives is safe. Pickle's protocol 5 hands numpy arrays (the audio) out of
band: they travel as raw buffers after the pickle, gathered by `sendmsg` without a serialising copy, and the
receiver's arrays are views of the bytes it read.

A message: [length of the rest][pickle length][buffer count][buffer lengths...][pickle][buffers...], uint64 LE.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any, cast

_U64 = struct.Struct("<Q")
_HEAD = struct.Struct("<QQ")
MAX_MESSAGE = 1 << 32  # a message this large is a bug, not traffic
_IOV_MAX = 512  # frames per sendmsg (Linux allows 1024)


def pack(message: Any) -> list[bytes | memoryview]:
    """The frames of one message, in order."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    head = struct.pack(f"<{2 + len(raws)}Q", len(data), len(raws), *(raw.nbytes for raw in raws))
    total = len(head) + len(data) + sum(raw.nbytes for raw in raws)
    return [_U64.pack(total) + head, data, *raws]


def unpack(body: bytearray | memoryview) -> Any:
    """A message from its body (everything after its length): arrays in it are views of `body`."""
    view = memoryview(body)
    data_length, count = _HEAD.unpack_from(view)
    lengths = struct.unpack_from(f"<{count}Q", view, _HEAD.size)
    offset = _HEAD.size + count * _U64.size
    data = view[offset : offset + data_length]
    offset += data_length
    buffers = []
    for length in lengths:
        buffers.append(view[offset : offset + length])
        offset += length
    return pickle.loads(data, buffers=buffers)


def send(sock: socket.socket, message: Any) -> None:
    """Blocking: the whole message, or OSError."""
    send_frames(sock, pack(message))


def send_frames(sock: socket.socket, frames: list[bytes | memoryview]) -> None:
    """Blocking: the frames of a message (pack), or what send_some left of them; or OSError."""
    pending = deque(memoryview(frame) for frame in frames)
    while pending:
        _advance(pending, sock.sendmsg([pending[i] for i in range(min(_IOV_MAX, len(pending)))]))


def send_some(sock: socket.socket, frames: list[bytes | memoryview]) -> list[memoryview]:
    """Without blocking: as much of the frames as the socket takes now; what it did not (empty: all sent). OSError if
    the socket is broken."""
    pending = deque(memoryview(frame) for frame in frames)
    while pending:
        try:
            sent = sock.sendmsg([pending[i] for i in range(min(_IOV_MAX, len(pending)))], [], socket.MSG_DONTWAIT)
        except BlockingIOError:
            break
        _advance(pending, sent)
    return list(pending)


def _advance(pending: deque[memoryview], sent: int) -> None:
    """Drop the `sent` bytes from the front of `pending` (and the empty frames after them)."""
    while sent:
        if sent >= pending[0].nbytes:
            sent -= pending.popleft().nbytes
        else:
            pending[0], sent = pending[0][sent:], 0
    while pending and not pending[0].nbytes:
        pending.popleft()


class Unframer:
    """Messages out of a byte stream read in whatever pieces the socket gave (a reader that takes all a socket holds
    at once, instead of a message at a time): `feed` returns the messages the pieces so far complete."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buffer = self._buffer
        buffer += data
        messages, start = [], 0
        while len(buffer) - start >= _U64.size:
            (total,) = _U64.unpack_from(buffer, start)
            if total > MAX_MESSAGE:
                raise ValueError(f"a message of {total} bytes")
            end = start + _U64.size + total
            if len(buffer) < end:
                break
            # Its own copy: the message's arrays are views of it, and the buffer is reused.
            messages.append(unpack(buffer[start + _U64.size : end]))
            start = end
        del buffer[:start]
        return messages


def write(writer: asyncio.WriteTransport | asyncio.StreamWriter, message: Any) -> None:
    """Queue a message on an event loop's connection (buffered; the transport writes it as the socket takes it)."""
    writer.writelines(pack(message))


class Receiver(asyncio.Protocol):
    """The event loop's end of a connection: each message that arrives goes to `handler` right from `data_received`,
    whole and in order. Read through an asyncio StreamReader instead, a message cost a task switch and two awaited
    reads; on an idle server those run cold, and each hop of one session's first segment (worker to coordinator and
    back, engine to worker) took ~0.1-0.2 ms longer (docs/benchmarks.md, "End to end over the WebSocket").

    Until a handler is set (`hand_to`) messages are held; `first()` waits for the first one (a handshake). `closed`
    resolves once the connection has ended: None when the peer closed it, else what ended it (the socket broke, a
    malformed message, the handler raised). Nothing is handed over after that.
    """

    def __init__(self, handler: Callable[[Any], None] | None = None) -> None:
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._unframer = Unframer()
        self._held: deque[Any] = deque()  # messages that arrived before a handler was set
        self._arrived = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if self.closed.done():
            return
        try:
            for message in self._unframer.feed(data):
                if self.handler is None:
                    self._held.append(message)
                    self._arrived.set()
                else:
                    self.handler(message)
        except Exception as exc:  # the connection is unusable from here: its owner hears why through `closed`
            self._end(exc)
            assert self.transport is not None
            self.transport.abort()

    def eof_received(self) -> bool:
        return False  # the transport closes, and connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)
        self._arrived.set()

    def _end(self, exc: BaseException | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)

    def send(self, message: Any) -> None:
        """Queue a message (as `write`); dropped once the connection is closing."""
        if self.transport is not None and not self.transport.is_closing():
            write(self.transport, message)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def first(self) -> Any:
        """The first message, before a handler is set; EOFError if the connection ends first."""
        while not self._held:
            if self.closed.done():
                raise EOFError(f"the connection ended: {self.closed.result() or 'closed by the peer'}")
            self._arrived.clear()
            await self._arrived.wait()
        return self._held.popleft()

    def hand_to(self, handler: Callable[[Any], None]) -> None:
        """From now on messages go to `handler`, the held ones first."""
        self.handler = handler
        while self._held:
            handler(self._held.popleft())


async def connect(path: str, handler: Callable[[Any], None] | None = None) -> Receiver:
    """A connection to the Unix socket at `path` (OSError if nobody listens there)."""
    _, receiver = await asyncio.get_running_loop().create_unix_connection(lambda: Receiver(handler), path)
    return receiver


async def serve(path: str, connection: Callable[[], Receiver]) -> asyncio.Server:
    """Listen at `path`; each connection gets the Receiver that `connection()` makes (its handler set or to be set in
    its connection_made)."""
    return await asyncio.get_running_loop().create_unix_server(connection, path)
