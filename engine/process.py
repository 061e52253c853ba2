"""An engine in a process of its own, serving the server's worker processes over a Unix socket (engine.client is the
other end).

The process's main thread runs the step loop (engine.engine_loop). One thread reads every worker's commands (`Intake`:
making the requests' sequences there, off the step loop), and each connected worker has a thread that writes the step's
items to it, so a worker that is slow to read delays only its own audio, never a step. A small hand-over (one or two
streams' chunks) the step loop writes itself, as far as the socket takes it without blocking, when nothing is queued
ahead of it: waking the writer thread, which then waited for the GIL behind the next step's host work, took the
chunk 0.64-1.26 ms to reach its worker on an H200 (one session; docs/benchmarks.md, "End to end over the WebSocket"). A
worker that goes away (its socket closes) loses its requests at the next step boundary. The supervisor starts this
process with `run` as the target (with OMP_WAIT_POLICY=PASSIVE: wsserver.supervisor says why) and stops it by closing
`control` (or with SIGTERM): open requests then fail with EngineError("engine closed").

Messages (tuples, engine.ipc): from a worker `("add", request)`, `("abort", id)`, `("pause", id)`, `("resume", id)`,
`("encode", call_id, wav, padding)`, `("check", call_id, request)`, `("load_lora", call_id, name, directory)`,
`("unload_lora", call_id, name)`; to it `("hello", info, stats, pid)` once, then
`("items", [(id, chunk | error | None)...], stats)` per step, `("reply", call_id, result | error)` and
`("stats", stats)` while idle.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import queue
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from engine import ipc
from engine.config import EngineConfig
from engine.device import resolve_device
from engine.engine_core import EngineCore
from engine.engine_loop import Abort, Add, DropChannel, Encode, EngineLoop, Item, LoadLoRA, Pause, Resume, UnloadLoRA
from engine.outputs import EngineError

logger = logging.getLogger(__name__)

STATS_EVERY_S = 0.25  # how often an idle engine tells its workers how it is
# A hand-over of at most this many items the step loop writes itself (WorkerChannel): the few streams a worker has at
# low load, where a step's audio is waited for. More, and the copying would lengthen every step; the writer threads do
# it beside the step loop.
INLINE_ITEMS = 2
SWITCH_INTERVAL_S = 0.0005  # the GIL's hand-over interval while serving (settle_for_serving)
READ_BYTES = 1 << 18  # the most the intake takes from one worker's socket at a turn


@dataclass(frozen=True, slots=True)
class _Rest:
    """What the socket did not take of a message the step loop wrote itself: the writer thread sends it first."""

    frames: list[memoryview]


class WorkerChannel:
    """One worker's connection: its commands in (read by the process's `Intake`), its requests' items out."""

    def __init__(self, sock: socket.socket, engine: EngineLoop) -> None:
        self.sock, self.engine = sock, engine
        self.unframer = ipc.Unframer()
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._unwritten = 0  # guarded by _lock: messages in the outbox the writer thread has not finished writing
        self.open = True
        self.writer = threading.Thread(target=self._write, name="engine-send", daemon=True)
        self.writer.start()

    def deliver(self, items: list[tuple[str, Item]]) -> bool:
        if self.open:
            message = ("items", items, self.engine.stats())
            if len(items) <= INLINE_ITEMS:
                self._write_now(message)
            else:
                self._queue(message)
        return self.open

    def send(self, message: Any) -> None:
        if self.open:
            self._queue(message)

    def _queue(self, message: Any) -> None:
        with self._lock:
            self._unwritten += 1
            self.outbox.put(message)

    def _write_now(self, message: Any) -> None:
        """Write `message` on this thread, unless the writer thread has messages still to write (it would overtake
        them); what the socket does not take at once goes to the writer thread, ahead of anything later."""
        with self._lock:
            if self._unwritten:
                self._unwritten += 1
                self.outbox.put(message)
                return
            try:
                rest: list[memoryview] | None = ipc.send_some(self.sock, ipc.pack(message))
            except OSError:
                rest = None
            if rest:
                self._unwritten += 1
                self.outbox.put(_Rest(rest))
        if rest is None:
            self.gone()  # the socket broke: as the writer thread would have found

    def finish(self, timeout: float) -> None:
        """Write what is queued (the shut-down's errors), then close."""
        self.outbox.put(None)
        self.writer.join(timeout)

    def _write(self) -> None:
        try:
            while (message := self.outbox.get()) is not None:
                if isinstance(message, _Rest):
                    ipc.send_frames(self.sock, message.frames)
                else:
                    ipc.send(self.sock, message)
                with self._lock:
                    self._unwritten -= 1
        except OSError:
            pass
        self.gone()
        # The intake owns the socket: a shut-down one reads as closed there, which unregisters and closes it.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def handle(self, kind: str, *args: Any) -> None:
        """One command (on the intake's thread)."""
        core = self.engine.core
        if kind == "add":
            (request,) = args
            try:
                seq = core.make_sequence(request)  # no engine state touched: safe off the step loop
            except EngineError as exc:
                self.deliver([(request.request_id, exc)])
                return
            self.engine.submit(Add(seq, self))
        elif kind in ("abort", "pause", "resume"):
            self.engine.submit({"abort": Abort, "pause": Pause, "resume": Resume}[kind](*args))
        elif kind == "encode":
            call_id, wav, padding = args
            self.engine.submit(Encode(wav, padding, lambda result, c=call_id: self.send(("reply", c, result))))
        elif kind == "load_lora":
            # Reading the adapter takes a while: on a thread of its own, so that commands go on.
            threading.Thread(target=self._load_lora, args=args, name="engine-lora", daemon=True).start()
        elif kind == "unload_lora":
            call_id, name = args
            self.engine.submit(UnloadLoRA(name, lambda result, c=call_id: self.send(("reply", c, result))))
        elif kind == "check":
            call_id, request = args
            try:
                core.make_sequence(request)
                self.send(("reply", call_id, None))
            except EngineError as exc:
                self.send(("reply", call_id, exc))
        else:
            raise ValueError(f"unknown command {kind!r}")

    def _load_lora(self, call_id: int, name: str, directory: str) -> None:
        try:
            adapter = self.engine.core.read_lora(directory)
            self.engine.submit(LoadLoRA(name, adapter, lambda result: self.send(("reply", call_id, result))))
        except EngineError as exc:
            self.send(("reply", call_id, exc))

    def gone(self) -> None:
        if not self.open:
            return
        self.open = False
        self.outbox.put(None)
        with contextlib.suppress(EngineError):  # the engine stopped: it dropped everything already
            self.engine.submit(DropChannel(self))


class Intake:
    """One thread reads every worker's commands, taking all that a socket holds at each turn.

    A burst of sessions sends its first requests through every worker at once. With a reader thread per worker, each
    request cost its thread a wait for the GIL behind the others' at every socket read and at each small op of its
    making (on one H200, 512 requests released within 13 ms reached the step loop over 171 ms: 334 us each); one
    thread makes them back to back.
    """

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self._new: queue.SimpleQueue[WorkerChannel] = queue.SimpleQueue()
        self._wake_read, self._wake = socket.socketpair()
        self.selector.register(self._wake_read, selectors.EVENT_READ)
        threading.Thread(target=self._run, name="engine-recv", daemon=True).start()

    def add(self, channel: WorkerChannel) -> None:
        """Any thread: read `channel` from now on."""
        self._new.put(channel)
        self._wake.send(b"\0")

    def _run(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    self._wake_read.recv(4096)
                    while not self._new.empty():
                        channel = self._new.get()
                        self.selector.register(channel.sock, selectors.EVENT_READ, channel)
                else:
                    self._read(key.data)

    def _read(self, channel: WorkerChannel) -> None:
        try:
            data = channel.sock.recv(READ_BYTES)
            if not data:
                raise EOFError("the worker closed its connection")
            for kind, *args in channel.unframer.feed(data):
                channel.handle(kind, *args)
            return
        except EngineError as exc:  # the engine stopped: the worker hears it from the step loop's shut-down
            logger.debug("engine stopped while reading a worker: %s", exc)
        except (EOFError, OSError):
            pass
        except Exception:  # a command this end cannot take: that worker's link is broken, the others' are not
            logger.exception("dropping a worker whose command failed")
        channel.gone()
        self.selector.unregister(channel.sock)
        channel.sock.close()


def settle_for_serving(switch_interval_s: float = SWITCH_INTERVAL_S) -> None:
    """Once loaded and warmed up, before the first request. Everything made so far (torch, the model, its graphs)
    lives as long as the process: it leaves the collector's scans, which stop every thread, the step loop's too
    (the server's processes do the same). And the GIL changes hands sooner: the step loop gives it up at every wait
    for the device, and at Python's 5 ms the thread turning a burst of arrivals into sequences kept it that long
    each time (on an H200, 512 sessions starting at once: a level's longest step 267-617 ms, median 412, in 12 levels
    before; 185-509 ms, median 222, in 13 after).
    """
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(switch_interval_s)


def run(config: EngineConfig, path: str, control: Connection, gpu: str | None = None) -> None:
    """The engine process (a multiprocessing spawn target): load, warm up, serve `path` until `control` closes.

    `gpu`: the one GPU this process uses (set before CUDA starts, so the engine's "cuda" is that GPU). Tells the
    supervisor over `control`: ("ready", info) once serving, or ("failed", message).
    """
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    tag = f"engine[{os.getpid()}]"
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {tag} %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when to stop (a ^C reaches the whole group)
    loaded = threading.Event()
    engines: list[EngineLoop] = []

    def watch_control() -> None:
        with contextlib.suppress(EOFError, OSError):
            control.recv()  # nothing is ever sent: this returns when the supervisor closes its end or dies
        if not loaded.is_set():
            os._exit(0)  # still loading the model, which cannot be interrupted: nobody waits for it any more
        engines[0].stop()

    threading.Thread(target=watch_control, name="engine-control", daemon=True).start()
    if resolve_device(config.device).type == "cuda":
        # The step runs on the GPU; the host only stages small arrays. At torch's default, a team of OpenMP threads
        # (one per core) would start with the first large host-side op, at some point mid-run (a 10,000-session
        # soak saw 15 threads appear at once after 8,000 sessions), to compete with the worker processes for cores.
        torch.set_num_threads(1)
    try:
        engine = EngineLoop(EngineCore(config))
    except Exception as exc:
        logger.exception("engine failed to load")
        control.send(("failed", f"cannot load the model: {exc!r}"))
        return
    engines.append(engine)
    loaded.set()
    signal.signal(signal.SIGTERM, lambda *_: engine.stop())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    channels: list[WorkerChannel] = []

    def accept() -> None:
        intake = Intake()
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            channel = WorkerChannel(sock, engine)
            channel.send(("hello", engine.core.info, engine.stats(), os.getpid()))
            channels.append(channel)
            intake.add(channel)

    def report() -> None:
        """Stats to every worker while the engine idles (a step's items carry them otherwise)."""
        while True:
            time.sleep(STATS_EVERY_S)
            for channel in list(channels):
                channel.send(("stats", engine.stats()))

    def on_ready(error: BaseException | None) -> None:
        if error is not None:
            control.send(("failed", str(error)))
            return
        settle_for_serving()
        for target in (accept, report):
            threading.Thread(target=target, name=f"engine-{target.__name__}", daemon=True).start()
        control.send(("ready", engine.core.info))

    engine.run(on_ready)  # returns once stopped, every open request failed and told
    listener.close()
    for channel in list(channels):
        channel.finish(timeout=5.0)
