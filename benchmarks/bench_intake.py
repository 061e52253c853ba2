"""How fast an engine process takes in a burst: its intake thread (engine.process) turning requests that every worker
sent at once into queued sequences, on the host's CPU alone (no step runs).

Each round fills `--workers` Unix socket pairs with `--requests` add commands in all (dealt round-robin, as the
supervisor deals sessions), the way worker processes would have sent a burst's first segments, then lets the intake
read them and times the span from its start to the last sequence queued for the step loop. One JSON line per round:
`workers`, `requests`, `span_ms`, `us_per_request`. The model only builds prompts (tokenizer, prompt packing), so a
tiny random checkpoint (the default) and a full-size one give about the same figures.

    python benchmarks/bench_intake.py [--model CKPT] [--workers 14] [--requests 512] [--rounds 3]

On this repository's 2-core development machine (2026-11-28), 14 workers and 512 requests: 67-131 us a request.
The reader thread per worker and the prompts built with torch ops that the intake thread replaced took 520-660 us a
request in a harness of the same shape (README, "Processes").
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from pathlib import Path

import orjson

from engine import ipc
from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.engine_loop import Add, Command
from engine.models.voxcpm.make_checkpoint import make_checkpoint
from engine.outputs import EngineStats
from engine.params import GenerationParams, GenerationRequest
from engine.process import Intake, WorkerChannel

TEXT = "Thanks for calling, "  # ws_latency's first segment
BUFFER_BYTES = 4 << 20  # a socket holds a whole round's share unread


class StepLoop:
    """What a worker's channel reaches of the engine loop, queueing the commands for a count instead of a step."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.adds: list[Add] = []  # list.append is atomic: the intake thread appends, the round reads

    def submit(self, command: Command) -> None:
        if isinstance(command, Add):
            self.adds.append(command)

    def stats(self) -> EngineStats:
        return self.core.stats()


def run_round(
    intake: Intake, core: EngineCore, workers: int, requests: int, timeout_s: float = 60.0
) -> dict[str, float]:
    """One burst of `requests` from `workers` through `intake`."""
    loop = StepLoop(core)
    pairs = [socket.socketpair() for _ in range(workers)]
    try:
        for sender, receiver in pairs:
            sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
            receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
        for k in range(requests):
            params = GenerationParams(seed=k, max_patches=60)
            ipc.send(pairs[k % workers][0], ("add", GenerationRequest(text=TEXT, params=params, request_id=str(k))))
        start = time.monotonic()
        for _, receiver in pairs:
            intake.add(WorkerChannel(receiver, loop))  # type: ignore[arg-type]  # the part of EngineLoop it uses
        deadline = start + timeout_s
        while len(loop.adds) < requests:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(loop.adds)} of {requests} requests taken in after {timeout_s} s")
            time.sleep(0.01)
        span = max(add.seq.received_time for add in loop.adds) - start
    finally:
        for sender, _ in pairs:
            sender.close()  # the intake reads the end of each connection and closes its side
    return {
        "workers": workers,
        "requests": requests,
        "span_ms": round(span * 1e3, 2),
        "us_per_request": round(span / requests * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a checkpoint directory (default: a tiny random VoxCPM2 one, made here)")
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = str(Path(scratch) / "voxcpm2-tiny")
            make_checkpoint("voxcpm2", "tiny", Path(model))
        core, intake = EngineCore(EngineConfig(model=model, device="cpu")), Intake()
        for _ in range(args.rounds):
            print(orjson.dumps(run_round(intake, core, args.workers, args.requests)).decode(), flush=True)


if __name__ == "__main__":
    main()
