"""engine.ipc: messages framed over a byte stream, whole however the stream cuts them, arrays out of band."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvloop

from engine import ipc


def stream(*messages: object) -> bytes:
    return b"".join(bytes(frame) for message in messages for frame in ipc.pack(message))


def test_send_then_unframe_what_a_socket_holds() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        audio = np.arange(6, dtype=np.float32)
        ipc.send(ours, ("items", [("a", audio)], None))
        ipc.send(ours, ("stats", 3))
        ours.close()
        data = b""
        while chunk := theirs.recv(1 << 16):
            data += chunk
        (kind, [(request_id, got)], stats), second = ipc.Unframer().feed(data)
        assert (kind, request_id, stats, second) == ("items", "a", None, ("stats", 3)) and np.array_equal(got, audio)


def test_unframer_gives_whole_messages_however_the_bytes_are_cut() -> None:
    messages = [("add", "x" * n, np.full(n, n, dtype=np.int64)) for n in (0, 1, 300, 70_000)]
    data = stream(*messages)
    rng = random.Random(0)
    for _ in range(20):
        unframer, got, start = ipc.Unframer(), [], 0
        while start < len(data):  # pieces of 1 byte up to several messages
            end = start + rng.choice([1, 7, 100, 5_000, 200_000])
            got += unframer.feed(data[start:end])
            start = end
        assert len(got) == len(messages)
        for (kind, text, array), (want_kind, want_text, want_array) in zip(got, messages, strict=True):
            assert (kind, text) == (want_kind, want_text) and np.array_equal(array, want_array)


def test_unframer_messages_keep_their_arrays_while_it_reads_on() -> None:
    """A message's arrays are views of its own bytes, not of the buffer the next pieces are read into."""
    unframer = ipc.Unframer()
    data = stream(("a", np.ones(64)), ("b", np.zeros(64)))
    [(_, first)] = unframer.feed(data[: len(data) // 2 + 8])
    [(_, second)] = unframer.feed(data[len(data) // 2 + 8 :] + stream(("c", np.full(64, 7.0)))[:20])
    assert np.array_equal(first, np.ones(64)) and np.array_equal(second, np.zeros(64))


def test_unframer_refuses_an_impossible_length() -> None:
    with pytest.raises(ValueError, match="bytes"):
        ipc.Unframer().feed((ipc.MAX_MESSAGE + 1).to_bytes(8, "little"))


def test_send_some_takes_what_the_socket_takes_and_send_frames_the_rest() -> None:
    """Without blocking, a message larger than the socket's buffer goes in part; the rest, sent later, completes it."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        audio = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
        rest = ipc.send_some(ours, ipc.pack(("items", [("a", audio)], None)))
        assert rest and sum(frame.nbytes for frame in rest) < audio.nbytes + 1024  # some went
        assert ipc.send_some(ours, [memoryview(b"x")]) == [memoryview(b"x")]  # full: nothing more goes
        data = bytearray()
        reader = threading.Thread(target=lambda: _read_all(theirs, data))
        reader.start()
        ipc.send_frames(ours, rest)
        ipc.send(ours, ("stats", 3))
        ours.shutdown(socket.SHUT_WR)
        reader.join()
        (kind, [(request_id, got)], stats), second = ipc.Unframer().feed(bytes(data))
        assert (kind, request_id, stats, second) == ("items", "a", None, ("stats", 3)) and np.array_equal(got, audio)


def _read_all(sock: socket.socket, into: bytearray) -> None:
    while chunk := sock.recv(1 << 16):
        into += chunk


async def _served(
    tmp_path: Path, handler: Callable[[Any], None] | None, name: str = "s"
) -> tuple[ipc.Receiver, ipc.Receiver]:
    """Both ends of one connection over a Unix socket: (ours, served), each an ipc.Receiver."""
    accepted: asyncio.Future[ipc.Receiver] = asyncio.get_running_loop().create_future()

    def connection() -> ipc.Receiver:
        receiver = ipc.Receiver(handler)
        accepted.set_result(receiver)
        return receiver

    path = str(tmp_path / f"{name}.sock")
    server = await ipc.serve(path, connection)
    ours = await ipc.connect(path)
    theirs = await asyncio.wait_for(accepted, 5)
    server.close()  # no more connections; the one made stays open
    return ours, theirs


async def test_a_receiver_hands_over_each_message_whole_and_in_order(tmp_path: Path) -> None:
    got: list[Any] = []
    ours, theirs = await _served(tmp_path, got.append)
    messages = [("add", "x" * n, np.full(n, n, dtype=np.int64)) for n in (0, 1, 300, 70_000, 3_000_000)]
    for message in messages:
        ours.send(message)
    ours.close()
    assert await asyncio.wait_for(theirs.closed, 5) is None  # the peer closed: no error
    assert len(got) == len(messages)
    for (kind, text, array), (want_kind, want_text, want_array) in zip(got, messages, strict=True):
        assert (kind, text) == (want_kind, want_text) and np.array_equal(array, want_array)


async def test_a_receiver_holds_messages_until_it_has_a_handler(tmp_path: Path) -> None:
    """A handshake: `first()` is the first message, and the ones that came with it reach the handler, in order."""
    ours, theirs = await _served(tmp_path, None)
    for n in range(4):
        theirs.send(("m", n))
    assert await asyncio.wait_for(ours.first(), 5) == ("m", 0)
    while len(ours._held) < 3:
        await asyncio.sleep(0.01)
    got: list[Any] = []
    ours.hand_to(got.append)
    theirs.send(("m", 4))
    while len(got) < 4:
        await asyncio.sleep(0.01)
    assert got == [("m", 1), ("m", 2), ("m", 3), ("m", 4)]
    ours.close()


async def test_first_raises_eof_when_the_connection_ends_before_any_message(tmp_path: Path) -> None:
    ours, theirs = await _served(tmp_path, None)
    theirs.close()
    with pytest.raises(EOFError, match="closed by the peer"):
        await asyncio.wait_for(ours.first(), 5)


async def test_a_malformed_message_or_a_failing_handler_ends_the_connection_and_says_why(tmp_path: Path) -> None:
    ours, theirs = await _served(tmp_path, lambda message: None)
    assert theirs.transport is not None
    ours.transport.write((ipc.MAX_MESSAGE + 1).to_bytes(8, "little"))  # type: ignore[union-attr]
    assert isinstance(await asyncio.wait_for(theirs.closed, 5), ValueError)
    assert await asyncio.wait_for(ours.closed, 5) is None  # ours sees the connection closed under it

    def fail(message: Any) -> None:
        raise RuntimeError(f"cannot take {message!r}")

    got: list[Any] = []
    ours, theirs = await _served(tmp_path, got.append, "second")
    theirs.hand_to(fail)
    ours.send(("a",))
    ours.send(("b",))
    error = await asyncio.wait_for(theirs.closed, 5)
    assert isinstance(error, RuntimeError) and "('a',)" in str(error)
    theirs.send(("after",))  # dropped: the connection is closing
    assert await asyncio.wait_for(ours.closed, 5) is None and got == []


def test_a_receiver_serves_on_uvloop_too(tmp_path: Path) -> None:
    """The servers run uvloop, whose transports are not asyncio's classes."""
    uvloop.run(test_a_receiver_hands_over_each_message_whole_and_in_order(tmp_path))
