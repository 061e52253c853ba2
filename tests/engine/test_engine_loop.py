"""EngineLoop's first-chunk hold (EngineConfig.first_chunk_hold_positions), driven step by step from the test thread
(standing in for the loop's own): a first chunk waits for the second while a large admission is due, including
arrivals submitted but not yet queued; it is handed over in order, unchanged; an abort drops it. A burst window:
its lead admitted at once, the rest once quiet, an abort never ahead of its request; one cut by its cap leading the
rest into one step; arrivals in it extending it without waking the loop. And the loop on its own thread:
it trims the heap once per idle spell that follows steps, never while it has work. A large step's chunks: handed over
while the next step runs (after an abort's end never), the last before the loop waits; a channel that refuses them
loses its requests after that step, not during it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engine import engine_loop
from engine.engine_core import EngineCore
from engine.engine_loop import Abort, Add, EngineLoop, Item
from engine.outputs import AudioChunk
from engine.params import GenerationParams, GenerationRequest
from tests.engine.helpers import engine_config


class Recorder:
    """A channel that keeps every delivery (one list per step)."""

    def __init__(self) -> None:
        self.deliveries: list[list[tuple[str, Item]]] = []

    def deliver(self, items: list[tuple[str, Item]]) -> bool:
        self.deliveries.append(list(items))
        return True

    def chunks(self, request_id: str) -> list[AudioChunk]:
        return [item for batch in self.deliveries for rid, item in batch if rid == request_id and item is not None]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint("voxcpm2", stop=False)


def _loop(checkpoint: Path, hold: int) -> EngineLoop:
    return EngineLoop(EngineCore(engine_config(checkpoint, first_chunk_hold_positions=hold)))


def _submit(loop: EngineLoop, channel: Recorder, request_id: str, seed: int, max_patches: int = 3) -> None:
    params = GenerationParams(seed=seed, max_patches=max_patches)
    seq = loop.core.make_sequence(GenerationRequest(text="hello there", params=params, request_id=request_id))
    loop.submit(Add(seq, channel))


def _step(loop: EngineLoop, arrivals: Callable[[], None] = lambda: None) -> None:
    """One turn of the loop: queued commands, a step, then (after `arrivals` submit more) the delivery."""
    loop._run_commands()
    step = loop.core.step_lazily(while_running=loop._while_running)
    loop._drop_unread()
    arrivals()
    loop._stepped(step)


def _burst(loop: EngineLoop, channel: Recorder) -> None:
    """r1 alone in the first step; r2 arrives during it (submitted, not yet queued when r1's first chunk is out)."""
    _submit(loop, channel, "r1", 1)
    _step(loop, lambda: _submit(loop, channel, "r2", 2))
    while loop.core.has_work() or loop._commands:
        _step(loop)


def test_a_first_chunk_waits_while_a_large_admission_is_due(checkpoint: Path) -> None:
    channel = Recorder()
    loop = _loop(checkpoint, hold=1)  # any admission ahead holds
    _burst(loop, channel)
    # Nothing was handed over after the first step: r1's first chunk was held, r2 being due in the next step.
    assert [(rid, item.index) for rid, item in channel.deliveries[0]] == [("r1", 0), ("r1", 1), ("r2", 0)]
    assert [c.index for c in channel.chunks("r1")] == [0, 1, 2] and [c.index for c in channel.chunks("r2")] == [0, 1, 2]
    assert loop._held == {}
    # The held chunk is the chunk as made (its samples copied out of the step's buffer before the next step).
    reference = Recorder()
    _burst(_loop(checkpoint, hold=0), reference)
    assert [(rid, item.index) for rid, item in reference.deliveries[0]] == [("r1", 0)]  # without it, at once
    for request_id in ("r1", "r2"):
        for got, want in zip(channel.chunks(request_id), reference.chunks(request_id), strict=True):
            np.testing.assert_array_equal(got.samples, want.samples)


def test_a_small_admission_ahead_holds_nothing(checkpoint: Path) -> None:
    channel = Recorder()
    loop = _loop(checkpoint, hold=10_000)
    _burst(loop, channel)
    assert [(rid, item.index) for rid, item in channel.deliveries[0]] == [("r1", 0)]


def test_an_abort_drops_a_held_chunk(checkpoint: Path) -> None:
    channel = Recorder()
    loop = _loop(checkpoint, hold=1)
    _submit(loop, channel, "r1", 1)
    _step(loop, lambda: _submit(loop, channel, "r2", 2))
    assert "r1" in loop._held
    loop.submit(Abort("r1"))
    while loop.core.has_work() or loop._commands:
        _step(loop)
    assert loop._held == {}
    assert ("r1", None) in [entry for batch in channel.deliveries for entry in batch]  # its end, no audio
    assert channel.chunks("r1") == []
    assert [c.index for c in channel.chunks("r2")] == [0, 1, 2]


class Clock:
    """engine_loop's time.monotonic, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def test_a_burst_window_admits_its_lead_at_once_and_keeps_an_abort_behind_its_request(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lead goes into the first step; arrivals after it wait until the burst has been quiet for coalesce_ms (here
    1 s), while the lead streams; an abort queued behind a waiting arrival waits with it, so that it ends its request
    instead of running before it (the request would then run on, aborted by nobody)."""
    clock = Clock()
    monkeypatch.setattr(engine_loop, "time", clock)
    config = engine_config(checkpoint, coalesce_ms=1000.0, coalesce_max_ms=5000.0)
    loop, channel = EngineLoop(EngineCore(config)), Recorder()
    _submit(loop, channel, "lead", 1, max_patches=20)  # stepping throughout
    assert loop._wait_for_work()  # idle: the lead opens the window and waits for nothing
    _step(loop)
    assert [rid for rid, _ in channel.deliveries[0]] == ["lead"]
    clock.now += 0.5
    _submit(loop, channel, "r1", 2)
    loop.submit(Abort("r1"))
    clock.now += 0.5
    _submit(loop, channel, "r2", 3)
    for _ in range(3):
        clock.now += 0.3  # r2 came 0.9 s ago: not yet quiet
        assert loop._wait_for_work()  # the lead is stepping: no wait
        _step(loop)
    assert [type(command).__name__ for command in loop._commands] == ["Add", "Abort", "Add"]
    assert {rid for batch in channel.deliveries for rid, _ in batch} == {"lead"}
    clock.now += 0.2  # quiet for 1.1 s: r1 is admitted, ended by its abort before any step, and r2 joins
    _step(loop)
    assert loop._commands == []
    assert [entry for batch in channel.deliveries for entry in batch if entry[0] == "r1"] == [("r1", None)]
    assert [rid for rid, _ in channel.deliveries[-1]] == ["lead", "r2"]


def test_a_led_burst_lands_in_one_step_at_the_idle_budget(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rest of a led burst is admitted as if the engine were idle: the lead waits with its burst, which the
    decoding budget would cut in two waves a step apart. Later admissions get the decoding budget again."""
    clock = Clock()
    monkeypatch.setattr(engine_loop, "time", clock)
    probe = EngineCore(engine_config(checkpoint)).make_sequence(GenerationRequest(text="hello there"))
    positions = probe.num_prompt  # every request here says the same
    config = engine_config(
        checkpoint,
        max_num_seqs=8,
        coalesce_ms=1000.0,
        coalesce_max_ms=5000.0,
        max_prefill_tokens=2 * positions,
        idle_prefill_tokens=4 * positions,
    )
    loop, channel = EngineLoop(EngineCore(config)), Recorder()
    _submit(loop, channel, "lead", 1, max_patches=12)
    assert loop._wait_for_work()
    _step(loop)  # the lead, at once
    for name in ("r1", "r2", "r3", "r4"):
        _submit(loop, channel, name, 2)
    clock.now += 1.1  # quiet: the burst's rest goes in, all four in one step (the decoding budget takes two)
    _step(loop)
    assert [rid for rid, _ in channel.deliveries[-1]] == ["lead", "r1", "r2", "r3", "r4"]
    _submit(loop, channel, "r5", 3)
    _submit(loop, channel, "r6", 4)
    _submit(loop, channel, "r7", 5)
    _step(loop)  # streams decode: the step budget, two prompts (a slot is free for the third)
    assert [rid for rid, item in channel.deliveries[-1] if item is not None and item.index == 0] == ["r5", "r6"]


def test_arrivals_queued_together_at_an_idle_engine_wait_for_quiet_and_a_lone_one_does_not(checkpoint: Path) -> None:
    """Several arrivals already queued when the idle loop wakes are a burst under way: none leads, all wait until
    coalesce_ms passed without another, then enter one step. A lone arrival goes at once."""
    config = engine_config(checkpoint, coalesce_ms=300.0, coalesce_max_ms=5000.0)
    loop, channel = EngineLoop(EngineCore(config)), Recorder()
    _submit(loop, channel, "r1", 1)
    _submit(loop, channel, "r2", 2)
    start = time.monotonic()
    assert loop._wait_for_work()
    assert time.monotonic() - start >= 0.3
    _step(loop)
    assert sorted(rid for rid, _ in channel.deliveries[0]) == ["r1", "r2"]
    while loop.core.has_work():
        _step(loop)
    _submit(loop, channel, "r3", 3)
    start = time.monotonic()
    assert loop._wait_for_work()
    assert time.monotonic() - start < 0.3
    _step(loop)
    assert [rid for rid, _ in channel.deliveries[-1]] == ["r3"]


class CountingCondition(threading.Condition):
    """The loop's condition, counting the wake-ups submitters ask for."""

    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_arrivals_during_a_burst_window_do_not_wake_the_loop_and_still_extend_it(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the loop waits for a burst to go quiet (here on its own thread), an arrival only moves the window's
    deadline later, which the loop reads when it wakes at the old one: a submit does not wake it (one wake-up a request
    takes the GIL from the submitter). The burst still waits for its last arrival, and lands whole; stop() wakes it."""
    config = engine_config(checkpoint, max_num_seqs=8, coalesce_ms=200.0, coalesce_max_ms=5000.0)
    loop, channel = EngineLoop(EngineCore(config)), Recorder()
    cond = CountingCondition()
    monkeypatch.setattr(loop, "_cond", cond)
    _submit(loop, channel, "r1", 1)
    _submit(loop, channel, "r2", 2)  # queued together: a burst, no lead
    waited = threading.Thread(target=loop._wait_for_work)
    waited.start()
    deadline = time.monotonic() + 60
    while not loop._quieting and time.monotonic() < deadline:
        time.sleep(0.001)
    before, start = cond.notified, time.monotonic()
    for i in range(3, 8):  # every 100 ms, within the 200 ms of quiet the window waits for
        time.sleep(0.1)
        _submit(loop, channel, f"r{i}", i)
    last = time.monotonic()
    waited.join(60)
    assert cond.notified == before  # no arrival woke it
    assert time.monotonic() - start >= 0.5 and time.monotonic() - last >= 0.2  # and the window waited for all
    assert not loop._quieting
    _step(loop)
    assert sorted(rid for rid, _ in channel.deliveries[0]) == [f"r{i}" for i in range(1, 8)]
    while loop.core.has_work():
        _step(loop)
    _submit(loop, channel, "r8", 8)
    _submit(loop, channel, "r9", 9)
    stopped = threading.Thread(target=loop._wait_for_work)
    stopped.start()
    while not loop._quieting and time.monotonic() < deadline:
        time.sleep(0.001)
    start = time.monotonic()
    loop.stop()
    stopped.join(60)
    assert time.monotonic() - start < 0.15  # woken by stop(), not by its window's 200 ms


class ArrivingWhileWaiting(threading.Condition):
    """The loop's condition on the test's clock: a wait passes at once, the clock moving on to its timeout or to the
    next arrival (then submitted), whichever comes first."""

    def __init__(self, clock: Clock, arrivals: list[tuple[float, Callable[[], None]]]) -> None:
        super().__init__()
        self.clock, self.arrivals = clock, sorted(arrivals, key=lambda arrival: arrival[0])

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None  # a burst window's wait
        end = self.clock.now + timeout
        if self.arrivals and self.arrivals[0][0] <= end:
            self.clock.now, submit = self.arrivals.pop(0)
            submit()  # the lock is re-entrant: submit() takes it as another thread would
            return True
        self.clock.now = end
        return False


@pytest.mark.parametrize("cut", [True, False])
def test_a_burst_cut_by_the_window_cap_leads_the_rest_into_one_step(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, cut: bool
) -> None:
    """Arrivals queued together at an idle engine wait for quiet (coalesce_ms 50) at most coalesce_max_ms (100). Still
    arriving at the cap, the window's four go in and lead the rest: the four that come during their step enter the
    next one together, at the idle budget. A window that went quiet before its cap leads nothing: the four later ones
    get the decoding budget, two a step."""
    clock = Clock()
    monkeypatch.setattr(engine_loop, "time", clock)
    probe = EngineCore(engine_config(checkpoint)).make_sequence(GenerationRequest(text="hello there"))
    config = engine_config(
        checkpoint,
        max_num_seqs=8,
        coalesce_ms=50.0,
        coalesce_max_ms=100.0,
        max_prefill_tokens=2 * probe.num_prompt,
        idle_prefill_tokens=4 * probe.num_prompt,
    )
    loop, channel = EngineLoop(EngineCore(config)), Recorder()
    later = (0.040, 0.080) if cut else (0.010, 0.020)  # the window's last arrival 80 ms in: quiet only at 130 ms
    arrivals = [
        (clock.now + t, lambda n=n: _submit(loop, channel, n, 2, max_patches=12))
        for n, t in zip(("r3", "r4"), later, strict=True)
    ]
    monkeypatch.setattr(loop, "_cond", ArrivingWhileWaiting(clock, arrivals))
    _submit(loop, channel, "r1", 1, max_patches=12)
    _submit(loop, channel, "r2", 1, max_patches=12)
    assert loop._wait_for_work()
    assert clock.now == pytest.approx(100.1 if cut else 100.07)  # closed by the cap, or by 50 ms of quiet
    _step(loop, lambda: [_submit(loop, channel, f"r{i}", 3, max_patches=12) for i in range(5, 9)])
    assert sorted(rid for rid, _ in channel.deliveries[0]) == ["r1", "r2", "r3", "r4"]
    _step(loop)
    started = [rid for rid, item in channel.deliveries[-1] if item is not None and item.index == 0]
    assert started == (["r5", "r6", "r7", "r8"] if cut else ["r5", "r6"])


def _quietening_burst(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, ahead_tokens: int
) -> tuple[EngineLoop, Recorder, list[list[str]]]:
    """r1 and r2 queued together at an idle engine (a burst, no lead; coalesce_ms 50), then r3 at 10 ms, an abort of
    r1 at 15, r4 at 20, r5 at 30: the loop once its window has closed, its channel, and the requests each prefill
    ahead took in."""
    clock = Clock()
    monkeypatch.setattr(engine_loop, "time", clock)
    config = engine_config(
        checkpoint,
        dtype="float64",  # bit for bit: the CPU's float32 GEMMs round a row differently for other row counts
        max_num_seqs=8,
        coalesce_ms=50.0,
        coalesce_max_ms=5000.0,
        prefill_ahead_tokens=ahead_tokens,
    )
    loop, channel = EngineLoop(EngineCore(config)), Recorder()
    prefills: list[list[str]] = []
    prefill_ahead = loop.core.prefill_ahead

    def recorded() -> None:
        before = {seq.request_id for seq in loop.core.scheduler.running}
        prefill_ahead()
        prefills.append(sorted({seq.request_id for seq in loop.core.scheduler.running} - before))

    monkeypatch.setattr(loop.core, "prefill_ahead", recorded)
    arrivals = [
        (clock.now + 0.010, lambda: _submit(loop, channel, "r3", 3)),
        (clock.now + 0.015, lambda: loop.submit(Abort("r1"))),
        (clock.now + 0.020, lambda: _submit(loop, channel, "r4", 4)),
        (clock.now + 0.030, lambda: _submit(loop, channel, "r5", 5)),
    ]
    monkeypatch.setattr(loop, "_cond", ArrivingWhileWaiting(clock, arrivals))
    _submit(loop, channel, "r1", 1)
    _submit(loop, channel, "r2", 2)
    assert loop._wait_for_work()
    assert clock.now == pytest.approx(100.08)  # quiet 50 ms after the last arrival, whatever went ahead
    return loop, channel, prefills


def test_a_quietening_burst_is_prefilled_ahead_as_it_arrives_and_starts_in_one_step(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a burst goes quiet at an idle engine, each time two prompts' positions are queued (prefill_ahead_tokens)
    the loop takes them in and prefills them ahead; an abort that arrives for one of them ends it when taken in. The
    window still closes on quiet, and one step starts the whole burst, with the bits of the same burst admitted in
    that step (prefill_ahead_tokens 0)."""
    positions = EngineCore(engine_config(checkpoint)).make_sequence(GenerationRequest(text="hello there")).num_prompt
    audio, audio_of = [], ("r2", "r3", "r4", "r5")
    for ahead_tokens in (2 * positions, 0):
        loop, channel, prefills = _quietening_burst(checkpoint, monkeypatch, ahead_tokens)
        running = loop.core.scheduler.running
        waiting = [command.seq.request_id for command in loop._commands if isinstance(command, Add)]
        if ahead_tokens:
            assert prefills == [["r1", "r2"], ["r3", "r4"]] and waiting == ["r5"]
            assert [seq.request_id for seq in running] == ["r2", "r3", "r4"]
            assert all(seq.prefilled_ahead for seq in running)
            assert channel.deliveries == [[("r1", None)]]  # ended when the abort was taken in, with r4
        else:
            assert prefills == [] and not running and waiting == ["r1", "r2", "r3", "r4", "r5"]
        _step(loop)
        assert sorted(rid for rid, item in channel.deliveries[-1] if item is not None) == ["r2", "r3", "r4", "r5"]
        while loop.core.has_work():
            _step(loop)
        assert len(loop.core.scheduler.free_slots) == 8
        audio.append({rid: np.concatenate([chunk.samples for chunk in channel.chunks(rid)]) for rid in audio_of})
    for rid in audio_of:
        np.testing.assert_array_equal(audio[0][rid], audio[1][rid])


def test_an_arrival_that_makes_a_prefill_ahead_due_wakes_the_quietening_loop(checkpoint: Path) -> None:
    """On the loop's own thread: arrivals below prefill_ahead_tokens leave the quietening loop asleep; the one that
    reaches it wakes the loop, which prefills all three long before the window's 2 s of quiet are up."""
    positions = EngineCore(engine_config(checkpoint)).make_sequence(GenerationRequest(text="hello there")).num_prompt
    config = engine_config(
        checkpoint, max_num_seqs=8, coalesce_ms=2000.0, coalesce_max_ms=5000.0, prefill_ahead_tokens=3 * positions
    )
    loop, channel = EngineLoop(EngineCore(config)), Recorder()
    _submit(loop, channel, "r1", 1)
    _submit(loop, channel, "r2", 2)
    waited = threading.Thread(target=loop._wait_for_work)
    waited.start()
    deadline = time.monotonic() + 60
    while not loop._quieting and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)
    assert not loop.core.scheduler.running
    start = time.monotonic()
    _submit(loop, channel, "r3", 3)
    running = loop.core.scheduler.running
    while not (len(running) == 3 and all(seq.prefilled_ahead for seq in running)) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert time.monotonic() - start < 1.0 and loop._quieting  # woken, not at the window's end
    loop.stop()
    waited.join(60)


def test_admission_ahead_counts_the_queue_then_arrivals_within_slots_and_budget(checkpoint: Path) -> None:
    core = EngineCore(engine_config(checkpoint, max_num_seqs=2, max_prefill_tokens=100, idle_prefill_tokens=0))
    assert core.admission_ahead([]) == 0
    assert core.admission_ahead([30, 40, 50]) == 70  # two free slots
    assert core.admission_ahead([80, 40]) == 80  # the budget stops the second
    assert core.admission_ahead([150]) == 150  # a prompt longer than the budget goes in alone
    idle = EngineCore(engine_config(checkpoint, max_num_seqs=2, max_prefill_tokens=100, idle_prefill_tokens=120))
    assert idle.admission_ahead([80, 40]) == 120  # nothing decodes: the next step's budget is the idle one


def test_an_idle_loop_trims_the_heap_once_after_warm_up_and_after_each_busy_spell(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[bool] = []  # per trim: whether the core had work then
    monkeypatch.setattr(engine_loop, "HEAP_TRIM_IDLE_S", 0.05)
    loop = _loop(checkpoint, hold=0)
    monkeypatch.setattr(engine_loop, "trim_heap", lambda: trims.append(loop.core.has_work()) or True)
    channel = Recorder()
    ready = threading.Event()
    thread = threading.Thread(target=loop.run, args=(lambda error: ready.set(),))
    thread.start()

    def settle(count: int) -> None:
        """Until `count` trims happened (a loaded machine wakes the loop late), then a while more: none may follow."""
        deadline = time.monotonic() + 60
        while len(trims) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)

    try:
        assert ready.wait(60)
        settle(1)
        assert trims == [False]  # after warm-up, once however long it idles
        _submit(loop, channel, "r1", 1)
        deadline = time.monotonic() + 60
        while not any(chunk.finish_reason for chunk in channel.chunks("r1")) and time.monotonic() < deadline:
            time.sleep(0.01)
        settle(2)
        assert len(channel.chunks("r1")) == 3
        assert trims == [False, False]
    finally:
        loop.stop()
        thread.join(10)


def test_the_runner_warms_up_on_the_loop_thread_before_the_loop_serves(checkpoint: Path) -> None:
    """ModelRunner.warm_up runs once, where the steps run, before the warm-up request and before `on_ready`."""
    loop = _loop(checkpoint, hold=0)
    events: list[tuple[str, str]] = []
    loop.core.runner.warm_up = lambda: events.append(("warm_up", threading.current_thread().name))
    step = loop.core.step
    loop.core.step = lambda **kw: events.append(("step", threading.current_thread().name)) or step(**kw)
    ready = threading.Event()
    thread = threading.Thread(target=loop.run, args=(lambda error: events.append(("ready", "")) or ready.set(),),
                              name="engine-loop")  # fmt: skip
    thread.start()
    try:
        assert ready.wait(30)
        assert events[0] == ("warm_up", "engine-loop") and events[1] == ("step", "engine-loop")
        assert [kind for kind, _ in events].count("warm_up") == 1 and events[-1] == ("ready", "")
    finally:
        loop.stop()
        thread.join(10)


def test_a_large_steps_chunks_go_while_the_next_step_runs_and_the_last_before_the_loop_waits(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_loop, "DEFER_ITEMS", 1)  # two streams' chunks are a large hand-over
    loop = _loop(checkpoint, hold=0)
    events: list[object] = []
    run = loop.core.runner.run

    def traced(batch: list, while_running: Callable[[], None]) -> object:
        ours = any(seq.request_id in ("r1", "r2") for seq in batch)  # not the warm-up's
        events.append("run") if ours else None
        result = run(batch, while_running)
        events.append("ran") if ours else None
        return result

    class Log(Recorder):
        def deliver(self, items: list[tuple[str, Item]]) -> bool:
            events.append(sorted((rid, item.index) for rid, item in items if item is not None))
            return super().deliver(items)

    loop.core.runner.run = traced
    channel = Log()
    _submit(loop, channel, "r1", 1)
    _submit(loop, channel, "r2", 2)  # queued together before the loop starts: one burst, one admission
    ready = threading.Event()
    thread = threading.Thread(target=loop.run, args=(lambda error: ready.set(),))
    thread.start()
    try:
        assert ready.wait(60)
        deadline = time.monotonic() + 60
        while len(channel.deliveries) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
        thread.join(10)
    first, second, third = ([("r1", i), ("r2", i)] for i in range(3))
    assert events == ["run", "ran", "run", first, "ran", "run", second, "ran", third]
    assert channel.chunks("r1")[-1].finish_reason is not None and channel.chunks("r2")[-1].finish_reason is not None


def test_an_abort_ends_its_request_behind_its_deferred_chunks(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_loop, "DEFER_ITEMS", 1)
    loop = _loop(checkpoint, hold=0)
    channel = Recorder()
    _submit(loop, channel, "r1", 1)
    _submit(loop, channel, "r2", 2)
    _step(loop)
    assert channel.deliveries == []  # two chunks: they wait for the next step
    loop.submit(Abort("r1"))
    _step(loop)
    assert [[(rid, None if item is None else item.index) for rid, item in batch] for batch in channel.deliveries] == [
        [("r1", 0), ("r2", 0), ("r1", None)],  # the end goes behind them, in the same hand-over
        [("r2", 1)],  # one chunk: at once
    ]


def test_a_channel_that_refuses_a_deferred_hand_over_loses_its_requests_after_the_step(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_loop, "DEFER_ITEMS", 1)
    loop = _loop(checkpoint, hold=0)
    running_then: list[set[str]] = []

    class Gone(Recorder):
        def deliver(self, items: list[tuple[str, Item]]) -> bool:
            running_then.append({seq.request_id for seq in loop.core.scheduler.running})
            return False

    channel = Gone()
    _submit(loop, channel, "r1", 1)
    _submit(loop, channel, "r2", 2)
    _step(loop)  # deferred
    _step(loop)  # handed over (refused) while the second step runs: its requests are still stepping then
    assert running_then == [{"r1", "r2"}]
    assert loop.core.healthy and not loop.core.has_work() and loop._owners == {} and loop._outbox == []
