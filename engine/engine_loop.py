"""The engine's step loop, wherever it runs: on a thread beside an event loop (AsyncEngine) or as the main loop of an
engine process (engine.process). It owns the EngineCore; everything else reaches it through `submit()`.

- Commands (`Add`, `Abort`, `Pause`, `Resume`, `Encode`, `DropChannel`, `LoadLoRA`, `UnloadLoRA`) queue under a
  condition variable and run at every step boundary, in order. A LoRA adapter arrives already read and checked
  (EngineCore.read_lora, on the caller's thread): the loop only copies it into its slot, so streams never wait.
- Each request belongs to a `Channel`, the way its chunks travel to its consumer (an event loop in this process, or a
  worker process's socket). After each step every channel gets ONE `deliver()` with all of its requests' items, in
  the engine's order: per request, its chunks, then None if it was cancelled or the EngineError that ends it.
- A lone arrival at an idle engine is admitted at once (the lead: a lone request waits for nothing) and opens a burst
  window: the arrivals after it wait for the rest of their burst (until `coalesce_ms` pass without another, at most
  `coalesce_max_ms` after the window opened), so that the burst lands in one prefill, while the lead streams on.
  That step does not count the lead as decoding (Scheduler.leads): the burst gets the idle engine's prefill budget,
  as if it had come without a lead, instead of the decoding one cutting it in waves a step apart.
  Several arrivals queued at once are a burst under way: they open the window and wait in it, none leading. A burst
  enters at the pace its senders send, and a fixed window would cut it: one still arriving when the window closes at
  its cap leads the rest as a lone arrival would (all it holds admitted at once, the rest in the next step at the
  idle budget). Commands queued behind a waiting arrival
  wait with it (an abort must not overtake its request). Otherwise arrivals join at the next step boundary.
  While the loop waits for a burst to go quiet, a submit does not wake it: it wakes at the window's deadline and reads
  how far the arrivals since have moved it (a wake-up a request took the GIL from the burst's submitter each time),
  unless `prefill_ahead_tokens` prompt positions have queued: then it takes them in and queues their prefill
  (EngineCore.prefill_ahead), so that the device works through the burst's prompts while the rest of it arrives,
  and the burst's first step is left with the last arrivals' prompts and every solver's start.
- While the next step is due to admit more than `first_chunk_hold_positions` prompt positions, a request's first
  chunk is held back and handed over with its second (EngineConfig says why); an abort drops it.
- A step's chunks for more than `DEFER_ITEMS` requests are made and handed over once the next step's device work is
  queued (`EngineCore.step_lazily(while_running=...)`), or before the loop waits if no step follows, or before the
  loop runs the next commands; anything else handed over (an abort's end, a failure) goes behind them, so that a
  request's items keep their order.
- Back-pressure is the consumer's: it sends `Pause` when it lags `max_buffered_chunks` behind and `Resume` once it
  caught up by half (engine.streams). A paused request keeps its KV blocks and slot but is not stepped.
- Once idle for `HEAP_TRIM_IDLE_S` after a step, the loop gives the host heap's freed memory back to the OS
  (engine.heap), outside the lock, so neither a step nor a submitter waits for it.
- A failure of the core fails every open request (and every queued command) with an EngineError; so does `stop()`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.config import EngineConfig
from engine.engine_core import EngineCore, StepChunks
from engine.heap import trim_heap
from engine.lora.format import Adapter
from engine.outputs import AudioChunk, EngineError, EngineStats
from engine.params import GenerationParams, GenerationRequest
from engine.sequence import Sequence

logger = logging.getLogger(__name__)

HEAP_TRIM_IDLE_S = 1.0  # idle this long after a step before the heap is trimmed: a trim can take tens of ms
# A step's chunks for more requests than this wait for the next step's device work to be queued before they are made
# and handed over: their consumers' Python work (an event loop's, the writer threads') would otherwise contend for the
# GIL with the host's part of the next step while the device waits for it (on an H200, a B=1,024 VoxCPM2 step took
# 175-177 ms under bench_engine's consumers, 168 without, 169.5-170 with this), and so would making them (~1 ms at
# B=1,024). A few go at once: one stream's next audio waits for nothing.
DEFER_ITEMS = 32

# What a channel delivers for one request: a chunk, None (cancelled), or the error that ends it.
Item = AudioChunk | EngineError | None


class Channel(Protocol):
    def deliver(self, items: list[tuple[str, Item]]) -> bool:
        """Hand a step's items to the consumers (engine thread; must not block). False: nobody reads this channel
        any more, and its requests are aborted."""
        ...


@dataclass(frozen=True, slots=True)
class Add:
    seq: Sequence
    channel: Channel


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Pause:
    request_id: str


@dataclass(frozen=True, slots=True)
class Resume:
    request_id: str


@dataclass(frozen=True, slots=True)
class Encode:
    wav: np.ndarray
    padding: str
    reply: Callable[[np.ndarray | EngineError], None]  # called on the engine thread with the latents or the error


@dataclass(frozen=True, slots=True)
class DropChannel:
    """The channel's consumers are gone (a worker process died): abort every request it carries."""

    channel: Channel


@dataclass(frozen=True, slots=True)
class LoadLoRA:
    name: str
    adapter: Adapter
    reply: Callable[[EngineError | None], None]  # called on the engine thread: None once resident, or the error


@dataclass(frozen=True, slots=True)
class UnloadLoRA:
    """Refused (EngineError) while any request uses the adapter: removing it would change their voice mid-stream."""

    name: str
    reply: Callable[[EngineError | None], None]


Command = Add | Abort | Pause | Resume | Encode | DropChannel | LoadLoRA | UnloadLoRA


class EngineLoop:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.config: EngineConfig = core.config
        self._cond = threading.Condition()
        self._commands: list[Command] = []  # guarded by _cond
        self._stopping = False  # guarded by _cond
        self._dead = False  # guarded by _cond: the loop has exited, commands are refused
        self._last_add = 0.0  # guarded by _cond: time.monotonic() of the newest Add
        self._burst_cap = 0.0  # guarded by _cond: time.monotonic() at which the open burst window closes at the latest
        self._lead = False  # guarded by _cond: the queued commands include a lead, to be admitted at once
        self._quieting = False  # guarded by _cond: the loop thread waits for a burst to go quiet (_wait_for_work)
        self._queued_positions = 0  # guarded by _cond: the prompt positions of the queued Adds
        self._ahead_tokens = core.prefill_ahead_tokens  # queued positions that a quietening burst prefills ahead at
        self._owners: dict[str, Channel] = {}  # loop thread only: the channel of every open request
        self._leads: frozenset[str] = frozenset()  # loop thread only: the open burst window's lead(s)
        self._held: dict[str, AudioChunk] = {}  # loop thread only: first chunks held back (first_chunk_hold_positions)
        self._outbox: list[tuple[Channel, str, Item]] = []  # loop thread only: items not handed over yet (_flush)
        # Loop thread only: the last step's chunks, not made yet, and whether its first chunks are held (_stepped).
        self._pending: tuple[StepChunks, bool] | None = None
        self._unread: list[str] = []  # loop thread only: requests whose channel refused a hand-over (_drop_unread)
        self._stepped_since_trim = False  # loop thread only
        self._stats: EngineStats = core.stats()  # replaced (never mutated) by the loop thread

    def stats(self) -> EngineStats:
        return self._stats

    def submit(self, command: Command) -> None:
        """Any thread. EngineError once the loop is stopping or gone (the command is not queued)."""
        with self._cond:
            if self._dead or self._stopping:
                raise EngineError("the engine is not running")
            self._commands.append(command)
            if isinstance(command, Add):
                self._last_add = time.monotonic()
                self._queued_positions += command.seq.num_prompt
            # A burst's window wakes at its deadline by itself, and an arrival only moves that later: waking the
            # loop thread for each of a burst's requests would take the GIL from their submitter every time. It wakes
            # once enough of the burst is queued to be prefilled ahead.
            if not self._quieting or self._ahead_due():
                self._cond.notify()

    def stop(self) -> None:
        """Any thread: the loop fails what is open with EngineError("engine closed") and returns."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def run(self, on_ready: Callable[[BaseException | None], None]) -> None:
        """The loop itself (blocks until stopped or failed). Warms up first, then calls `on_ready(None)`; a failure
        during warm-up calls `on_ready(error)` instead."""
        error = EngineError("engine closed")
        ready = False
        try:
            # Warm up here: per-thread caches (cuBLAS handles, cuDNN plans) must be warm where steps run.
            self._warm_up()
            ready = True
            on_ready(None)
            while self._wait_for_work():
                self._run_commands()
                if self.core.has_work():
                    step = self.core.step_lazily(while_running=self._while_running)
                    self._drop_unread()
                    self._stepped(step)
                    self._stepped_since_trim = True
                self._stats = self.core.stats()
        except EngineError as exc:
            logger.exception("engine failed")
            error = exc
        except BaseException as exc:
            logger.exception("engine loop crashed")
            error = EngineError(f"engine loop crashed: {exc!r}")
        if not ready:
            on_ready(error)
        self.shut_down(error)

    def _warm_up(self) -> None:
        start = time.monotonic()
        self.core.runner.warm_up()
        request = GenerationRequest(text="Warm up.", params=GenerationParams(seed=0, max_patches=2))
        self.core.add_request(request)
        while self.core.has_work():
            self.core.step()
        logger.info("warmed up in %.2f s", time.monotonic() - start)
        self._stats = self.core.stats()
        self._stepped_since_trim = True  # loading and warming up left freed buffers behind too

    def _wait_for_work(self) -> bool:
        """Block while idle; an arrival then opens a burst window as its lead, or, the window's lead having finished,
        waits for the rest of its burst (module docstring). False: stop."""
        if not self.core.has_work():  # no step follows at once: what the last one made goes now
            self._make_pending()
            self._hand_off([])
        with self._cond:
            if self.core.has_work():
                return not self._stopping
            while not self._commands and not self._stopping:
                if not self._stepped_since_trim:
                    self._cond.wait()
                elif not self._cond.wait(HEAP_TRIM_IDLE_S):
                    self._stepped_since_trim = False
                    self._cond.release()  # submitters must not wait for the trim
                    try:
                        trim_heap()
                    finally:
                        self._cond.acquire()
            adds = sum(isinstance(command, Add) for command in self._commands)
            if adds:
                if not self._burst_open(time.monotonic()):
                    self._burst_cap = time.monotonic() + self.config.coalesce_max_ms / 1e3
                    # A lone arrival leads; several at once are a burst already under way, which waits whole: led,
                    # the rest of it would wait for the lead's step (on an H200, 512 sessions: a lead of 14 sessions
                    # took 386 ms, its burst's first frames came 162 ms later).
                    self._lead = adds == 1
                if not self._lead:  # wait for the burst to go quiet, prefilling what has come ahead
                    cap = self._burst_cap
                    self._quieting = True
                    while not self._stopping and (deadline := self._burst_open(time.monotonic())) is not None:
                        if not self._ahead_due():
                            self._cond.wait(deadline - time.monotonic())
                            continue
                        self._cond.release()  # submitters must not wait for it
                        try:
                            self._prefill_ahead()
                        finally:
                            self._cond.acquire()
                    self._quieting = False
                    # Cut by the cap while still arriving: what came leads the rest, which the next step admits at
                    # the idle budget rather than the decoding one cutting it in waves (on an H200, 1,024 requests
                    # sent over ~200 ms: 178 in the window, the rest 91 a step over ten steps, 636 xRT against 959
                    # for a burst that went in whole).
                    self._lead = self._last_add + self.config.coalesce_ms / 1e3 > cap
            return not self._stopping

    def _burst_open(self, now: float) -> float | None:
        """Under _cond: while a burst window is open, when its waiting arrivals are due; None once it has closed (and
        it is closed here once they are due: later arrivals join at step boundaries until the engine idles again)."""
        if not self._burst_cap:
            return None
        deadline = min(self._last_add + self.config.coalesce_ms / 1e3, self._burst_cap)
        if deadline <= now:
            self._burst_cap = 0.0
            return None
        return deadline

    def _ahead_due(self) -> bool:
        """Under _cond: whether the queued arrivals are enough to prefill ahead of their burst's first step."""
        return 0 < self._ahead_tokens <= self._queued_positions

    def _prefill_ahead(self) -> None:
        """While a burst goes quiet: take in what has come (every queued command, in order) and queue its prefill."""
        self._run_commands(ahead=True)
        self.core.prefill_ahead()

    def _take_commands(self, ahead: bool = False) -> tuple[list[Command], bool, bool]:
        """The queued commands due now: all of them, but while a burst window is open (module docstring) only those
        ahead of its first waiting arrival, unless they go `ahead` of the window's end. And whether they lead a
        burst, and whether they are all there is (no window open)."""
        with self._cond:
            if ahead or self._lead or self._burst_open(time.monotonic()) is None:
                lead, self._lead = self._lead, False  # never one ahead: a window with a lead does not quieten
                commands, self._commands = self._commands, []
                self._queued_positions = 0
                return commands, lead, not lead and not ahead
            first_add = next((i for i, command in enumerate(self._commands) if isinstance(command, Add)), None)
            if first_add is None:
                commands, self._commands = self._commands, []
            else:
                commands, self._commands = self._commands[:first_add], self._commands[first_add:]
            return commands, False, False

    def _run_commands(self, ahead: bool = False) -> None:
        commands, lead, everything = self._take_commands(ahead)
        if commands:  # they see (and an abort's end goes behind) every chunk made so far
            self._make_pending()
        endings: list[tuple[Channel, str, Item]] = []  # requests these commands end, handed over together
        leads = []
        for command in commands:
            match command:
                case Add(seq=seq, channel=channel):
                    if (error := self._add(seq, channel)) is not None:
                        endings.append((channel, seq.request_id, error))
                    elif lead:
                        leads.append(seq.request_id)
                case Abort(request_id=request_id):
                    self.core.abort(request_id)
                    self._held.pop(request_id, None)
                    if (channel := self._owners.pop(request_id, None)) is not None:
                        endings.append((channel, request_id, None))
                case Pause(request_id=request_id):
                    if request_id in self._owners:
                        self.core.pause(request_id)
                case Resume(request_id=request_id):
                    if request_id in self._owners:
                        self.core.resume(request_id)
                case Encode(wav=wav, padding=padding, reply=reply):
                    try:
                        latents: np.ndarray | EngineError = self.core.encode_audio(wav, padding)
                    except EngineError as exc:
                        latents = exc
                    reply(latents)
                case LoadLoRA(name=name, adapter=adapter, reply=reply):
                    reply(self._lora_change(lambda: self.core.load_lora(name, adapter)))
                case UnloadLoRA(name=name, reply=reply):
                    reply(self._lora_change(lambda: self.core.unload_lora(name)))
                case DropChannel(channel=channel):
                    for request_id in [rid for rid, owner in self._owners.items() if owner is channel]:
                        self.core.abort(request_id)
                        del self._owners[request_id]
                        self._held.pop(request_id, None)
        if endings:  # behind what the outbox holds
            self._hand_off(endings)
        if leads:
            self._leads = frozenset(leads)
        elif everything and self._leads:  # the window closed: the next step admits the rest of the leads' burst
            self.core.lead_burst(self._leads)
            self._leads = frozenset()

    def _lora_change(self, change: Callable[[], None]) -> EngineError | None:
        try:
            change()
        except EngineError as exc:
            return exc
        self._stats = self.core.stats()  # the new adapter list is visible at once
        return None

    def _add(self, seq: Sequence, channel: Channel) -> EngineError | None:
        """Admit the request; the error that ends it at once if the engine refuses it."""
        if seq.request_id in self._owners:
            return EngineError(f"request id {seq.request_id!r} is already in use")
        try:
            self.core.add_sequence(seq)
        except EngineError as exc:
            return exc
        self._owners[seq.request_id] = channel
        return None

    def _stepped(self, step: StepChunks) -> None:
        """A step's chunks: made and handed over now if they are few, else once the next step's device work is queued
        (DEFER_ITEMS); whether its first chunks are held is decided now, with the next step still to come."""
        self._pending = (step, self._hold_first_chunks())
        if len(step) <= DEFER_ITEMS:
            self._make_pending()

    def _while_running(self) -> None:
        self._make_pending()
        self._flush()

    def _make_pending(self) -> None:
        if self._pending is not None:
            step, hold = self._pending
            self._pending = None
            self._deliver(step.make(), hold)

    def _deliver(self, chunks: list[AudioChunk], hold: bool) -> None:
        items: list[tuple[Channel, str, Item]] = []
        for chunk in chunks:
            channel = self._owners.get(chunk.request_id)
            if channel is None:
                continue
            if (held := self._held.pop(chunk.request_id, None)) is not None:
                items.append((channel, chunk.request_id, held))
            elif hold and chunk.index == 0 and chunk.finish_reason is None:
                # Samples are a view of the step's host buffer, which the next step overwrites.
                self._held[chunk.request_id] = dataclasses.replace(chunk, samples=chunk.samples.copy())
                continue
            if chunk.finish_reason is not None:
                del self._owners[chunk.request_id]
            items.append((channel, chunk.request_id, chunk))
        self._outbox.extend(items)
        if len(items) <= DEFER_ITEMS:
            self._hand_off([])

    def _hold_first_chunks(self) -> bool:
        """Whether the next step is due to admit more than first_chunk_hold_positions prompt positions, counting
        requests submitted but not yet queued (a burst's later arrivals land during the step that admits its first)."""
        limit = self.config.first_chunk_hold_positions
        if not limit:
            return False
        with self._cond:
            arriving = [command.seq.num_prompt for command in self._commands if isinstance(command, Add)]
        return self.core.admission_ahead(arriving) > limit

    def _hand_off(self, items: list[tuple[Channel, str, Item]]) -> None:
        """Hand `items` over now, behind those still in the outbox; a channel nobody reads loses its requests."""
        self._outbox.extend(items)
        self._flush()
        self._drop_unread()

    def _flush(self) -> None:
        """One deliver() per channel for the whole outbox, in order. It may run while a step is in flight (the step's
        `while_running`), so it leaves the core alone: a channel that refuses has its requests noted for
        `_drop_unread`."""
        by_channel: dict[Channel, list[tuple[str, Item]]] = {}
        for channel, request_id, item in self._outbox:
            by_channel.setdefault(channel, []).append((request_id, item))
        self._outbox = []
        for channel, batch in by_channel.items():
            if not channel.deliver(batch):
                self._unread.extend(request_id for request_id, _ in batch)

    def _drop_unread(self) -> None:
        for request_id in self._unread:
            self.core.abort(request_id)
            self._owners.pop(request_id, None)
            self._held.pop(request_id, None)
        self._unread = []

    def shut_down(self, error: EngineError) -> None:
        """Refuse new commands; fail queued ones and every open request with `error`."""
        with self._cond:
            self._dead = True
            commands, self._commands = self._commands, []
        self._make_pending()  # the last step's chunks go first, as they would have
        # Unhealthy, its requests dropped, before anyone hears of the failure, so that a failed request sees a
        # consistent stats(): a loop that died between steps would otherwise leave them running in the core forever.
        self.core.fail()
        self._stats = self.core.stats()
        endings: list[tuple[Channel, str, Item]] = []
        for command in commands:
            if isinstance(command, Add):
                endings.append((command.channel, command.seq.request_id, EngineError(str(error))))
            elif isinstance(command, Encode | LoadLoRA | UnloadLoRA):
                command.reply(EngineError(str(error)))
        endings.extend((channel, request_id, EngineError(str(error))) for request_id, channel in self._owners.items())
        self._owners.clear()
        self._held.clear()
        self._hand_off(endings)
