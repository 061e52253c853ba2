"""engine.ipc: messages framed over a byte stream, whole however the stream cuts them, arrays out of band."""

from __future__ import annotations

import random
import socket
import threading

import numpy as np
import pytest

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
