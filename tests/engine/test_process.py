"""An engine in its own process (engine.process) reached through EngineClient: the same results as in-process,
cancel, back-pressure, a worker that goes away, and an engine process that dies under load. And a worker's channel
on its own: small hand-overs written by the step loop, in order with what its writer thread still has to write."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import EngineError, FinishReason, GenerationParams, GenerationRequest, Prompt, ipc
from engine.client import EngineClient
from engine.engine_loop import DropChannel
from engine.outputs import AudioChunk
from engine.process import INLINE_ITEMS, SWITCH_INTERVAL_S, WorkerChannel, run, settle_for_serving
from tests.engine.helpers import engine_config

TIMEOUT = 60


@contextmanager
def engine_process(checkpoint: Path, **overrides: Any) -> Iterator[tuple[multiprocessing.Process, str]]:
    """An engine process as the supervisor starts one (OpenMP threads waiting passively: wsserver.supervisor)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # inherited by the spawned child
    context = multiprocessing.get_context("spawn")
    directory = tempfile.mkdtemp(prefix="engine-test-")
    path = os.path.join(directory, "engine.sock")
    ours, theirs = context.Pipe()
    process = context.Process(target=run, args=(engine_config(checkpoint, **overrides), path, theirs), daemon=True)
    process.start()
    theirs.close()
    try:
        assert ours.poll(TIMEOUT), "the engine process did not start"
        kind, info = ours.recv()
        assert kind == "ready", info
        yield process, path
    finally:
        ours.close()  # closing the control pipe stops the engine
        process.join(TIMEOUT)
        if process.is_alive():
            process.kill()
            process.join()


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Callable[..., Path]) -> Iterator[tuple[multiprocessing.Process, str]]:
    with engine_process(tiny_checkpoint("voxcpm2", stop=False), max_patches=64) as served:
        yield served


@pytest.fixture
async def client(served: tuple[multiprocessing.Process, str]) -> AsyncIterator[EngineClient]:
    client = await EngineClient.connect(served[1], max_buffered=4)
    yield client
    await client.close()


def request(request_id: str, max_patches: int = 6, seed: int = 1) -> GenerationRequest:
    params = GenerationParams(seed=seed, max_patches=max_patches, min_patches=max_patches)
    return GenerationRequest(text="Hello from another process.", params=params, request_id=request_id)


async def collect(client: EngineClient, req: GenerationRequest) -> list[Any]:
    return [chunk async for chunk in client.generate(req)]


async def wait_for(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_the_same_audio_as_in_process(client: EngineClient, engine: Any) -> None:
    """The session's in-process engine runs the same checkpoint: a seeded request gives the same audio."""
    remote = await asyncio.wait_for(collect(client, request("r", seed=5)), TIMEOUT)
    local = await asyncio.wait_for(collect(engine, request("l", seed=5)), TIMEOUT)
    assert [c.index for c in remote] == list(range(6)) and remote[-1].finish_reason is FinishReason.LENGTH
    np.testing.assert_allclose(np.concatenate([c.samples for c in remote]), np.concatenate([c.samples for c in local]))
    assert client.info == engine.info


async def test_concurrent_requests_cancel_and_back_pressure(client: EngineClient) -> None:
    results = await asyncio.wait_for(
        asyncio.gather(*(collect(client, request(f"c{i}", seed=i)) for i in range(3))), TIMEOUT
    )
    assert all(len(chunks) == 6 for chunks in results)
    # A consumer that stops reading gets its request paused, not dropped.
    slow = client.generate(request("slow", max_patches=20))
    await anext(slow)
    await wait_for(lambda: client.stats().paused == 1)
    rest = [chunk async for chunk in slow]
    assert [c.index for c in rest] == list(range(1, 20))
    # Leaving a stream cancels its request at once.
    async for chunk in client.generate(request("left", max_patches=40)):
        if chunk.index == 2:
            break
    await wait_for(lambda: client.stats().running == 0 and client.stats().paused == 0)


async def test_bad_requests_and_calls(client: EngineClient) -> None:
    with pytest.raises(EngineError, match="something to say"):
        await collect(client, GenerationRequest(text="   "))
    with pytest.raises(EngineError):
        await client.check(GenerationRequest(text=""))
    await client.check(GenerationRequest(text="fine"))
    # The conditioning fields cross the process link: the VoxCPM engine over there sees them and refuses each.
    for name in ("speaker", "instruction", "language"):
        with pytest.raises(EngineError, match=f"no {name}"):
            await client.check(GenerationRequest(text="fine", prompt=Prompt(**{name: "x"})))
    latents = await client.encode_audio(np.sin(np.arange(16000, dtype=np.float32) / 10), padding="left")
    assert latents.ndim == 3 and latents.shape[1:] == (client.info.patch_size, client.info.feat_dim)
    with pytest.raises(EngineError, match="padding"):
        await client.encode_audio(np.zeros(100, np.float32), padding="middle")


async def test_a_worker_that_goes_away_loses_its_requests(served: tuple[multiprocessing.Process, str]) -> None:
    leaving = await EngineClient.connect(served[1])
    staying = await EngineClient.connect(served[1])
    stream = leaving.generate(request("orphan", max_patches=60))
    await anext(stream)
    await leaving.close()  # as a worker process that died
    await wait_for(lambda: staying.stats().running == 0)
    assert len(await asyncio.wait_for(collect(staying, request("after")), TIMEOUT)) == 6
    await stream.aclose()
    await staying.close()


async def test_workers_come_and_go_while_others_stream(served: tuple[multiprocessing.Process, str]) -> None:
    """One thread reads every worker: requests from several at once all run, and workers that connect and leave (their
    sockets' numbers reused by the next) neither stop it nor leave it reading a closed socket."""
    staying = await EngineClient.connect(served[1])
    long = staying.generate(request("long", max_patches=40))
    await anext(long)
    for round_ in range(30):
        passing = await EngineClient.connect(served[1])
        if round_ % 10 == 0:
            clients = [passing, *[await EngineClient.connect(served[1]) for _ in range(2)]]
            burst = [collect(c, request(f"b{round_}-{i}", seed=i)) for i, c in enumerate(clients)]
            assert [len(chunks) for chunks in await asyncio.wait_for(asyncio.gather(*burst), TIMEOUT)] == [6, 6, 6]
            for client in clients[1:]:
                await client.close()
        await passing.close()
    assert [chunk.index async for chunk in long] == list(range(1, 40))
    assert len(await asyncio.wait_for(collect(staying, request("after")), TIMEOUT)) == 6
    await staying.close()


async def test_a_worker_whose_command_fails_is_dropped_alone(served: tuple[multiprocessing.Process, str]) -> None:
    """The one intake thread survives a command it cannot take: only that worker's connection ends."""
    staying = await EngineClient.connect(served[1])
    stream = staying.generate(request("on", max_patches=30))
    await anext(stream)
    for message in (("add",), ("abort", "a", "b"), ("no such command", 1)):
        reader, writer = await asyncio.open_unix_connection(served[1])
        ipc.write(writer, message)
        async with asyncio.timeout(TIMEOUT):
            await reader.read()  # the engine's hello, then the end of the connection
        assert reader.at_eof()
        writer.close()
    assert [chunk.index async for chunk in stream] == list(range(1, 30))
    await staying.close()


async def test_an_engine_process_that_dies_fails_its_requests(tiny_checkpoint: Callable[..., Path]) -> None:
    with engine_process(tiny_checkpoint("voxcpm2", stop=False), max_patches=200, max_model_len=512) as (process, path):
        client = await EngineClient.connect(path)
        lost = asyncio.Event()
        client.on_lost(lost.set)  # how the supervisor stops routing there at once
        stream = client.generate(request("doomed", max_patches=200))
        await anext(stream)
        assert not lost.is_set()
        os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(EngineError, match="gone"):
            async with asyncio.timeout(TIMEOUT):
                async for _ in stream:
                    pass
        assert not client.stats().healthy
        async with asyncio.timeout(1):
            await lost.wait()
        with pytest.raises(EngineError):
            await collect(client, request("later"))
        await client.close()


def test_settling_for_serving_freezes_the_heap_and_hands_the_gil_over_sooner() -> None:
    interval = sys.getswitchinterval()
    try:
        settle_for_serving()
        assert gc.get_freeze_count() > 0 and sys.getswitchinterval() == SWITCH_INTERVAL_S < interval
    finally:
        gc.unfreeze()
        sys.setswitchinterval(interval)


class _Loop:
    """The step loop as a channel sees it: its stats and the commands it is handed."""

    def __init__(self) -> None:
        self.commands: list[object] = []

    def stats(self) -> None:
        return None

    def submit(self, command: object) -> None:
        self.commands.append(command)


def _items(count: int, samples: int, first: int = 0) -> list[tuple[str, AudioChunk]]:
    """`count` chunks of `samples` samples whose values say which chunk they are."""
    return [
        (f"r{i}", AudioChunk(f"r{i}", 0, np.full(samples, i, dtype=np.float32), np.zeros((1, 1), dtype=np.float32)))
        for i in range(first, first + count)
    ]


def _read_messages(sock: socket.socket, count: int) -> list[Any]:
    unframer, messages = ipc.Unframer(), []
    while len(messages) < count:
        messages += unframer.feed(sock.recv(1 << 20))
    return messages


def test_a_small_hand_over_is_written_before_deliver_returns_and_a_large_one_by_the_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer_sent: list[object] = []
    send = ipc.send
    monkeypatch.setattr(ipc, "send", lambda sock, message: (writer_sent.append(message[0]), send(sock, message)))
    ours, theirs = socket.socketpair()
    with ours, theirs:
        channel = WorkerChannel(ours, _Loop())  # type: ignore[arg-type]
        assert channel.deliver(_items(2, 4800))
        theirs.setblocking(False)
        [(kind, items, _)] = ipc.Unframer().feed(theirs.recv(1 << 20))  # there already, whole
        assert kind == "items" and [rid for rid, _ in items] == ["r0", "r1"] and writer_sent == []
        theirs.setblocking(True)
        assert channel.deliver(_items(INLINE_ITEMS + 1, 480))
        [(kind, items, _)] = _read_messages(theirs, 1)
        assert len(items) == INLINE_ITEMS + 1 and writer_sent == ["items"]
        channel.finish(5)


def test_a_hand_over_the_socket_cannot_take_keeps_its_order_with_the_next() -> None:
    """A worker that does not read: the first hand-over goes in part, its rest and every later one queue for the
    writer thread in order, whatever their size, and all arrive whole once the worker reads."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        channel = WorkerChannel(ours, _Loop())  # type: ignore[arg-type]
        sizes = [(1, 1 << 18), (2, 100), (INLINE_ITEMS + 1, 100), (1, 10)]
        first = 0
        for count, samples in sizes:
            assert channel.deliver(_items(count, samples, first))
            first += count
        got: list[Any] = []
        reader = threading.Thread(target=lambda: got.extend(_read_messages(theirs, len(sizes))))
        reader.start()
        reader.join(TIMEOUT)
        chunks = [chunk for _, items, _ in got for _, chunk in items]
        assert [len(items) for _, items, _ in got] == [count for count, _ in sizes]
        assert [int(chunk.samples[0]) for chunk in chunks] == list(range(first))
        assert [chunk.samples.size for chunk in chunks][:1] == [1 << 18] and chunks[0].samples.max() == 0
        channel.finish(5)


def test_a_small_hand_over_waits_behind_what_the_writer_thread_is_writing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer thread is still writing a large hand-over: the small one after it must not overtake it."""
    release = threading.Event()
    send = ipc.send

    def held_send(sock: socket.socket, message: Any) -> None:
        release.wait(TIMEOUT)
        send(sock, message)

    monkeypatch.setattr(ipc, "send", held_send)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        channel = WorkerChannel(ours, _Loop())  # type: ignore[arg-type]
        assert channel.deliver(_items(INLINE_ITEMS + 1, 100))
        assert channel.deliver(_items(1, 100, first=INLINE_ITEMS + 1))
        release.set()
        got = _read_messages(theirs, 2)
        assert [len(items) for _, items, _ in got] == [INLINE_ITEMS + 1, 1]
        channel.finish(5)


def test_a_small_hand_over_to_a_closed_worker_drops_the_channel() -> None:
    ours, theirs = socket.socketpair()
    loop = _Loop()
    with ours:
        channel = WorkerChannel(ours, loop)  # type: ignore[arg-type]
        theirs.close()
        assert not channel.deliver(_items(1, 480))  # its requests are aborted by the step loop
        assert [type(command) for command in loop.commands] == [DropChannel]
        channel.writer.join(5)
        assert not channel.writer.is_alive()
