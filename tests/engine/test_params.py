"""engine.params: a request's id and seed are drawn without giving the GIL up (new_request_id says why)."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from engine.noise import draw_seed
from engine.params import GenerationParams, GenerationRequest, new_request_id


@pytest.fixture
def serving_switch_interval() -> Iterator[None]:
    """The engine process's GIL switch interval (engine.process.SWITCH_INTERVAL_S)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    yield
    sys.setswitchinterval(before)


def test_request_ids_are_32_hex_digits_and_differ() -> None:
    ids = {new_request_id() for _ in range(10_000)}
    assert len(ids) == 10_000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len({GenerationRequest(text="x").request_id for _ in range(100)}) == 100
    assert len({draw_seed() for _ in range(1000)}) == 1000 and all(0 <= draw_seed() < 2**63 for _ in range(1000))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_draws_other_ids_than_its_parent() -> None:
    """The server's processes may be forked: the random module reseeds a forked child, so ids do not repeat."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert len(child) == 32 and child != new_request_id()


def _wake_ms(work: object) -> float:
    """How long a thread waiting on a condition takes to run once notified, while this one does `work()` on."""
    cond, ready, woke = threading.Condition(), [], []

    def waiter() -> None:
        with cond:
            while not ready:
                cond.wait()
        woke.append(time.perf_counter())

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.02)
    with cond:
        ready.append(True)
        cond.notify()
        start = time.perf_counter()
    while not woke and time.perf_counter() - start < 0.5:
        work()  # type: ignore[operator]
    thread.join()
    return 1e3 * (woke[0] - start)


@pytest.mark.parametrize("drawn", ["request id", "seed"])
def test_a_burst_of_requests_does_not_keep_the_engine_loop_from_the_gil(
    serving_switch_interval: None, drawn: str
) -> None:
    """A thread making requests, each with a drawn id (a bench's, a worker's) or a drawn seed (the engine process's
    sequences of seedless requests), lets a notified thread (the engine loop) run within a few switch intervals. With
    uuid4 ids or secrets seeds (os.urandom, which gives the GIL up and takes it back each time) the waiter ran 13-300
    ms later on the development machine."""

    def request() -> None:
        if drawn == "seed":
            GenerationRequest(text="hello there", params=GenerationParams(seed=draw_seed()), request_id="r")
        else:
            GenerationRequest(text="hello there", params=GenerationParams(seed=1))
        total = 0
        for i in range(600):  # the rest of a request's ~50 us of Python, bytecode by bytecode
            total += i

    assert statistics.median(_wake_ms(request) for _ in range(3)) < 10.0
