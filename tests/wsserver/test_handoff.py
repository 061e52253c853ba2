"""The supervisor's deal of new connections to the workers (wsserver.handoff), in one process over real sockets:
the test plays the workers' side of the channels, or runs the real Receiver."""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
from collections.abc import AsyncIterator, Callable

import pytest

from wsserver.handoff import Dealer, Receiver


@pytest.fixture
async def dealer() -> AsyncIterator[Dealer]:
    dealer = Dealer(socket.create_server(("127.0.0.1", 0)))
    yield dealer
    await dealer.close()


class Worker:
    """A worker's end of a channel, read by the test: the connections it was dealt, kept open."""

    def __init__(self, channel: socket.socket) -> None:
        channel.setblocking(False)
        self.channel = channel
        self.connections: list[socket.socket] = []

    def read(self) -> None:
        while True:
            try:
                _, fds, _, _ = socket.recv_fds(self.channel, 1, 1)
            except BlockingIOError:
                return
            self.connections.extend(socket.socket(fileno=fd) for fd in fds)

    def report_closed(self, count: int) -> None:
        self.channel.send(struct.pack("!I", count))

    def close(self) -> None:
        self.read()
        for conn in self.connections:
            conn.close()
        self.channel.close()


async def connect(dealer: Dealer, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    port = dealer.listener.getsockname()[1]
    return [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]


async def settle(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_connections_go_to_the_worker_with_the_fewest_open(dealer: Dealer) -> None:
    workers = [Worker(dealer.attach(index)) for index in range(3)]
    dealer.start()
    clients = await connect(dealer, 12)
    await settle(lambda: sum(dealer.open_counts().values()) == 12)
    assert dealer.open_counts() == {0: 4, 1: 4, 2: 4}
    for worker in workers:
        worker.read()
    assert [len(worker.connections) for worker in workers] == [4, 4, 4]
    # Worker 0's sessions end: the next connections go there until it holds as many as the others.
    workers[0].report_closed(3)
    await settle(lambda: dealer.open_counts()[0] == 1)
    clients += await connect(dealer, 3)
    await settle(lambda: sum(dealer.open_counts().values()) == 12)
    assert dealer.open_counts() == {0: 4, 1: 4, 2: 4}
    for _, writer in clients:
        writer.close()
    for worker in workers:
        worker.close()


async def test_a_worker_whose_channel_closed_is_dealt_nothing(dealer: Dealer) -> None:
    workers = [Worker(dealer.attach(index)) for index in range(3)]
    dealer.start()
    workers[1].channel.close()  # its process died
    await settle(lambda: 1 not in dealer.open_counts())
    clients = await connect(dealer, 6)
    await settle(lambda: sum(dealer.open_counts().values()) == 6)
    assert dealer.open_counts() == {0: 3, 2: 3}
    # Started again, with a new channel: it is dealt the next connections.
    workers[1] = Worker(dealer.attach(1))
    clients += await connect(dealer, 3)
    await settle(lambda: sum(dealer.open_counts().values()) == 9)
    assert dealer.open_counts() == {0: 3, 1: 3, 2: 3}
    for _, writer in clients:
        writer.close()
    for worker in workers:
        worker.close()


async def test_a_worker_that_does_not_read_its_channel_is_passed_over(dealer: Dealer) -> None:
    stuck, reading = Worker(dealer.attach(0)), Worker(dealer.attach(1))
    spare_a, spare_b = socket.socketpair()  # any descriptor does for the deal
    with spare_a, spare_b:
        for _ in range(100_000):
            reading.read()
            assert dealer.deal(spare_a)
            if dealer.open_counts()[1] > dealer.open_counts()[0] + 10:
                break  # the stuck worker's channel is full: everything goes to the other
        else:
            pytest.fail("the stuck worker's channel never filled")
        stuck_count = dealer.open_counts()[0]
        for _ in range(20):
            reading.read()
            assert dealer.deal(spare_a)
        assert dealer.open_counts()[0] == stuck_count
        # With every channel full, the deal says so (the caller closes the connection; its client connects again).
        while dealer.deal(spare_a):
            pass
        assert not dealer.deal(spare_a)
        stuck.close()
        reading.close()


async def test_the_receiver_serves_dealt_connections_and_reports_their_end(dealer: Dealer) -> None:
    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    async def adopt(conn: socket.socket) -> asyncio.BaseTransport:
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(Echo, conn)
        return transport

    receiver = Receiver(dealer.attach(0), adopt)
    receiver.start()
    dealer.start()
    clients = await connect(dealer, 2)
    for reader, writer in clients:
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
    assert dealer.open_counts() == {0: 2}
    clients[0][1].close()
    await settle(lambda: dealer.open_counts() == {0: 1})
    # A worker that stops (its drain is over) closes its channel: the dealer stops dealing to it.
    receiver.close()
    await settle(lambda: dealer.open_counts() == {})
    clients[1][1].close()


async def test_a_failed_accept_does_not_stop_the_deal(dealer: Dealer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of descriptors (EMFILE) for a moment: the dealer logs, waits and accepts again."""
    loop = asyncio.get_running_loop()
    accept = loop.sock_accept
    failures = [OSError(errno.EMFILE, "Too many open files")]

    async def flaky_accept(sock: socket.socket) -> tuple[socket.socket, object]:
        if failures:
            raise failures.pop()
        return await accept(sock)

    monkeypatch.setattr(loop, "sock_accept", flaky_accept)
    worker = Worker(dealer.attach(0))
    dealer.start()
    clients = await connect(dealer, 2)
    await settle(lambda: dealer.open_counts() == {0: 2})
    assert not failures
    for _, writer in clients:
        writer.close()
    worker.close()
