"""`python -m wsserver` with worker processes: one engine process per device, front-end workers on one port, and the
coordinator between them, all started, watched and stopped from here.

    supervisor (this process): the port, the coordinator (seats, the slot FIFO, health, status)
      ├─ engine process per device (engine.process): the step loop, no networking but Unix sockets
      └─ worker process × N (wsserver.worker): uvicorn + websockets on the connections dealt to it, sessions, audio

The supervisor listens on the port and deals each new connection to the worker with the fewest open ones
(wsserver.handoff: the kernel's SO_REUSEPORT hash spread a burst at random, one busy worker in fourteen starving its
sessions), keeps the coordinator on a Unix socket in a private directory, and starts the engines and the workers at
once: the workers answer /health while the engines load, and start serving as each engine comes up. A worker that
dies is started again (its sessions are lost; the coordinator frees their seats and slots, the engines their
requests). An engine that dies fails every request on it that has made audio (one it had not started moves to another
engine); the coordinator stops routing to it the moment its connection drops, and with no engine left /ready and
/health answer 503, so the orchestrator restarts the server. SIGTERM drains: every worker drains
its sessions (docs/protocol.md), then the engines stop; SIGINT too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess

from engine import EngineConfig, EngineError, EngineStats
from engine.client import EngineClient
from wsserver.config import ServerConfig, resolve_model
from wsserver.coordinator import Coordinator
from wsserver.handoff import Dealer
from wsserver.link import serve_coordinator
from wsserver.loras import resolve_start_loras
from wsserver.worker import run as run_worker

logger = logging.getLogger("wsserver.supervisor")

_spawn = multiprocessing.get_context("spawn")  # CUDA and threads: never fork
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)  # a worker that keeps dying is started again ever more slowly
WATCH_EVERY_S = 0.2


def _engine_main(config: EngineConfig, path: str, control: Connection, gpu: str | None) -> None:
    """The engine process's target: it imports the engine (torch, the model code) itself; the supervisor never does.

    OpenMP threads wait passively (set before torch loads libgomp): spinning in their barriers, as they do by default,
    they fight the worker processes for the cores, and a CPU engine's step took 20x longer (25 -> 600 ms on the tiny
    model, two cores) while a worker was busy.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from engine.process import run

    run(config, path, control, gpu)


class _Starting:
    """An engine still loading, as the coordinator sees it: it takes nothing yet."""

    pid = None  # not known until it serves

    def __init__(self, slots: int) -> None:
        self._stats = EngineStats(0, 0, 0, slots, 0, 0, 0, 0.0, 0.0, healthy=False)

    def stats(self) -> EngineStats:
        return self._stats


@dataclass
class _Worker:
    index: int
    process: SpawnProcess
    restarts: int = 0
    started_at: float = field(default_factory=time.monotonic)


class Supervisor:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.devices = config.engine_devices()
        self.runtime = tempfile.mkdtemp(prefix="voxstream-")  # mode 0700: only this user reaches the sockets
        self.engine_paths = [os.path.join(self.runtime, f"engine-{i}.sock") for i in range(len(self.devices))]
        self.coordinator_path = os.path.join(self.runtime, "coordinator.sock")
        slots = [config.max_num_seqs] * len(self.devices)
        starting = [_Starting(n) for n in slots]
        self.coordinator = Coordinator(config.max_connections, starting, slots, config.client_limits())
        self.engines: list[tuple[SpawnProcess, Connection]] = []
        self.clients: list[EngineClient] = []
        self.workers: list[_Worker] = []
        self.stopping = False
        self.port = config.port
        self.dealer: Dealer | None = None  # made in run(): it needs the loop
        self.loras: tuple[tuple[str, str], ...] = ()  # the --lora adapters, fetched: (name, directory)

    async def run(self, stop: asyncio.Event) -> None:
        # The port is bound before the model loads, so that connections queue instead of being refused.
        listener = socket.create_server((self.config.bind_host, self.port), backlog=2048)
        self.port = listener.getsockname()[1]
        self.dealer = Dealer(listener)
        server = await serve_coordinator(self.coordinator, self.coordinator_path)
        self.coordinator.start()
        try:
            model = await asyncio.to_thread(resolve_model, self.config)
            self.loras = await asyncio.to_thread(resolve_start_loras, self.config)
            for index, device in enumerate(self.devices):
                self.engines.append(self._start_engine(index, model, device.device, device.gpu))
            self.workers = [_Worker(i, self._start_worker(i)) for i in range(self.config.worker_count())]
            self.dealer.start()
            logger.info(
                "listening on %s:%d: %d worker(s), %d engine(s)",
                self.config.bind_host,
                self.port,
                len(self.workers),
                len(self.engines),
            )
            engines_up = asyncio.create_task(self._engines_up())
            while not stop.is_set():
                self._restart_dead_workers()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WATCH_EVERY_S):
                        await stop.wait()
            engines_up.cancel()
        finally:
            await self._shut_down()
            await self.dealer.close()
            server.close()
            shutil.rmtree(self.runtime, ignore_errors=True)

    def _start_engine(self, index: int, model: str, device: str, gpu: str | None) -> tuple[SpawnProcess, Connection]:
        config = self.config.engine_config(model, device, self.loras, index)
        ours, theirs = _spawn.Pipe()
        process = _spawn.Process(
            target=_engine_main, args=(config, self.engine_paths[index], theirs, gpu), name=f"engine-{index}"
        )
        process.start()
        theirs.close()
        return process, ours

    def _start_worker(self, index: int) -> SpawnProcess:
        """Start worker `index` with a new channel from the dealer, and let go of our copy of its end (so that its
        death closes the channel)."""
        assert self.dealer is not None
        channel = self.dealer.attach(index)
        args = (self.config, channel, self.coordinator_path, self.engine_paths, index)
        process = _spawn.Process(target=run_worker, args=args, name=f"worker-{index}")
        process.start()  # the child receives a duplicate of the socket (multiprocessing's resource sharer)
        channel.close()
        return process

    async def _engines_up(self) -> None:
        """Wait for each engine to say it serves, then watch it through a client of its own."""
        for index, (process, control) in enumerate(self.engines):
            while not await asyncio.to_thread(control.poll, 0.5):
                if not process.is_alive():
                    logger.error("engine %d exited while loading (exit code %s)", index, process.exitcode)
                    break
            else:
                kind, detail = control.recv()
                if kind != "ready":
                    logger.error("engine %d failed to start: %s", index, detail)
                    continue
                try:
                    client = await EngineClient.connect(self.engine_paths[index])
                except EngineError as exc:
                    logger.error("engine %d: %s", index, exc)
                    continue
                self.clients.append(client)
                self.coordinator.engines[index] = client
                # Stop routing to an engine the moment its connection drops: at the next health poll (0.25 s later)
                # the 2-GPU kill run had granted 15 continuing segments to the dead engine, which all failed.
                client.on_lost(self.coordinator.check_engines)
                self.coordinator.check_engines()
                logger.info("engine %d serves %s at %d Hz", index, detail.name, detail.sample_rate)

    def _restart_dead_workers(self) -> None:
        for worker in self.workers:
            if worker.process.is_alive():
                continue
            backoff = RESTART_BACKOFF_S[min(worker.restarts, len(RESTART_BACKOFF_S) - 1)]
            if time.monotonic() - worker.started_at < backoff:
                continue
            logger.error("worker %d died (exit code %s): starting it again", worker.index, worker.process.exitcode)
            worker.process.close()
            worker.process = self._start_worker(worker.index)
            worker.restarts += 1
            worker.started_at = time.monotonic()

    async def _shut_down(self) -> None:
        """Drain: the workers finish (or cancel) their sessions and exit, then the engines stop."""
        self.coordinator.drain()
        self.coordinator.stop()  # engines stopping from here on are no news
        for worker in self.workers:
            if worker.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.drain_timeout_s + 10
        for worker in self.workers:
            await asyncio.to_thread(worker.process.join, max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                logger.error("worker %d did not drain in time: killed", worker.index)
                worker.process.kill()
                await asyncio.to_thread(worker.process.join)
        for client in self.clients:
            await client.close()
        for _, control in self.engines:
            control.close()  # the engine stops when its control pipe closes
        for index, (process, _) in enumerate(self.engines):
            await asyncio.to_thread(process.join, 30)
            if process.is_alive():
                logger.error("engine %d did not stop: killed", index)
                process.kill()
                await asyncio.to_thread(process.join)


async def supervise(config: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await Supervisor(config).run(stop)
