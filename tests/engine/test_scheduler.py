import random

import pytest

from engine.config import EngineConfig
from engine.outputs import FinishReason
from engine.pacing import AdmissionPacer
from engine.params import GenerationParams
from engine.scheduler import Scheduler
from engine.sequence import SequenceStatus
from tests.engine.helpers import FakeClock, make_pacer, make_seq


def make_scheduler(num_kv_blocks: int = 64, pacer: AdmissionPacer | None = None, **overrides) -> Scheduler:
    # idle_prefill_tokens 0: an idle step's budget is max_prefill_tokens too, unless a test says otherwise
    fields = dict(
        model="unused", max_num_seqs=4, max_model_len=64, kv_block_size=4, max_prefill_tokens=32, idle_prefill_tokens=0
    )
    fields.update(overrides)
    return Scheduler(EngineConfig(**fields), num_kv_blocks, pacer)


def check_invariants(scheduler: Scheduler) -> None:
    manager = scheduler.block_manager
    owned = [block for seq in scheduler.running for block in seq.block_table]
    assert len(owned) == len(set(owned)), "a block is owned twice"
    assert not set(owned) & set(manager.free_block_ids), "a block is both owned and free"
    assert len(owned) + manager.num_free_blocks == manager.num_blocks
    assert len(scheduler.running) <= scheduler.max_num_seqs
    slots = [seq.slot for seq in scheduler.running]
    assert sorted(slots + scheduler.free_slots) == list(range(scheduler.max_num_seqs))
    for seq in scheduler.running:
        assert seq.status in (SequenceStatus.RUNNING, SequenceStatus.PAUSED)
        assert len(seq.block_table) * manager.block_size >= seq.num_positions
        assert seq.num_generated < seq.max_patches
    for seq in scheduler.waiting:
        assert seq.status is SequenceStatus.WAITING and not seq.block_table and seq.slot == -1
    paused = sum(seq.status is SequenceStatus.PAUSED for seq in scheduler.running)
    assert (scheduler.num_paused, scheduler.num_running) == (paused, len(scheduler.running) - paused)
    assert set(scheduler.requests) == {seq.request_id for seq in [*scheduler.waiting, *scheduler.running]}


def step(scheduler: Scheduler, stops: list[bool] | None = None):
    batch = scheduler.schedule()
    finished = scheduler.postprocess(batch, stops or [False] * len(batch))
    return batch, finished


def test_prefill_is_mixed_with_decode():
    scheduler = make_scheduler()
    scheduler.add(make_seq("a"))
    batch, _ = step(scheduler)
    assert [seq.request_id for seq in batch] == ["a"] and batch[0].num_cached == 8
    scheduler.add(make_seq("b"))
    batch = scheduler.schedule()
    # the running stream decodes one position in the same step that prefills the newcomer
    assert [(seq.request_id, seq.num_new) for seq in batch] == [("a", 1), ("b", 8)]


def test_admission_is_bounded_by_slots():
    scheduler = make_scheduler(max_num_seqs=2)
    for name in "abc":
        scheduler.add(make_seq(name))
    batch, _ = step(scheduler)
    assert [seq.request_id for seq in batch] == ["a", "b"]
    assert [seq.request_id for seq in scheduler.waiting] == ["c"]
    scheduler.pause("a")  # a paused request keeps its slot
    assert [seq.request_id for seq in scheduler.schedule()] == ["b"]


def test_admission_is_bounded_by_prefill_budget_and_fifo():
    scheduler = make_scheduler(max_prefill_tokens=20)
    scheduler.add(make_seq("a", num_prompt=12))
    scheduler.add(make_seq("b", num_prompt=12))
    scheduler.add(make_seq("c", num_prompt=4))  # would fit the budget, but must not overtake b
    assert [seq.request_id for seq in scheduler.schedule()] == ["a"]
    assert [seq.request_id for seq in scheduler.schedule()] == ["a", "b", "c"]


def test_prompt_longer_than_the_budget_is_admitted_alone():
    scheduler = make_scheduler(max_prefill_tokens=8)
    scheduler.add(make_seq("long", num_prompt=20))
    scheduler.add(make_seq("short", num_prompt=4))
    assert [seq.request_id for seq in scheduler.schedule()] == ["long"]
    assert [seq.request_id for seq in scheduler.schedule()] == ["long", "short"]


def test_an_idle_engine_admits_up_to_the_idle_budget_and_a_decoding_one_up_to_the_step_budget():
    scheduler = make_scheduler(num_kv_blocks=128, max_num_seqs=8, max_prefill_tokens=16, idle_prefill_tokens=40)
    for name in "abcdef":
        scheduler.add(make_seq(name, num_prompt=8))
    assert scheduler.admission_ahead([]) == 40  # the next step is an idle one
    batch, _ = step(scheduler)
    assert [seq.request_id for seq in batch] == ["a", "b", "c", "d", "e"]  # 40 positions: nobody decodes yet
    for name in "gh":
        scheduler.add(make_seq(name, num_prompt=8))
    assert scheduler.admission_ahead([]) == 16  # streams decode now
    batch = scheduler.schedule()
    assert [seq.request_id for seq in batch if seq.is_prefill] == ["f", "g"]  # 16 positions


def test_a_bursts_leads_do_not_count_as_decoding_for_the_step_that_admits_it():
    scheduler = make_scheduler(num_kv_blocks=128, max_num_seqs=8, max_prefill_tokens=16, idle_prefill_tokens=40)
    scheduler.add(make_seq("lead", num_prompt=8))
    step(scheduler)
    for name in "abcd":
        scheduler.add(make_seq(name, num_prompt=8))
    scheduler.leads = frozenset(["lead"])
    assert scheduler.admission_ahead([]) == 32  # the idle budget: only the lead decodes
    batch = scheduler.schedule()
    assert [seq.request_id for seq in batch if seq.is_prefill] == ["a", "b", "c", "d"]  # 32 positions, one step
    scheduler.postprocess(batch, [False] * len(batch))
    assert scheduler.leads == frozenset()  # for that step only
    scheduler.add(make_seq("e", num_prompt=8))
    scheduler.add(make_seq("f", num_prompt=12))
    scheduler.leads = frozenset(["lead"])
    assert scheduler.admission_ahead([]) == 8  # others decode now: the step budget, leads or not
    assert [seq.request_id for seq in scheduler.schedule() if seq.is_prefill] == ["e"]


def test_requests_prefilled_ahead_are_admitted_in_full_passes_and_step_as_prefills():
    """admit_ahead (an idle engine, a burst still arriving): the queue's head run in passes of at most 24 positions
    and 2 requests, slots and blocks handed out, only once a pass is full (a part-filled one waits for more of the
    burst). Once their KV is written (EngineCore.prefill_ahead) they do not count as decoding: more may go ahead, and
    the step that starts them admits the rest at the idle budget (24 positions, not the step's 16), taking them as
    prefills with nothing left to prefill. Once streams decode, nothing goes ahead."""
    scheduler = make_scheduler(num_kv_blocks=128, max_num_seqs=8, max_prefill_tokens=16, idle_prefill_tokens=24)
    scheduler.add(make_seq("a", num_prompt=8))
    assert scheduler.admit_ahead(24, 2) == []  # part-filled: 8 positions, one request
    for name in "bcd":
        scheduler.add(make_seq(name, num_prompt=8))
    ahead = scheduler.admit_ahead(24, 2)
    assert [seq.request_id for seq in ahead] == ["a", "b"]  # two requests fill a pass
    check_invariants(scheduler)
    for seq in ahead:
        seq.num_cached = seq.num_prompt
    for name in "efgh":
        scheduler.add(make_seq(name, num_prompt=8))
    ahead = scheduler.admit_ahead(20, 3)
    assert [seq.request_id for seq in ahead] == ["c", "d"]  # 16 positions: "e" would not fit
    for seq in ahead:
        seq.num_cached = seq.num_prompt
    assert scheduler.admission_ahead([]) == 24  # nothing decodes: the idle budget
    batch = scheduler.schedule()
    assert [seq.request_id for seq in batch] == ["a", "b", "c", "d", "e", "f", "g"]
    assert all(seq.is_prefill for seq in batch)
    assert [seq.num_new for seq in batch] == [0, 0, 0, 0, 8, 8, 8]
    scheduler.postprocess(batch, [False] * len(batch))
    check_invariants(scheduler)
    with pytest.raises(AssertionError, match="idle"):  # streams decode now
        scheduler.admit_ahead(24, 2)


def test_a_pass_ahead_takes_a_prompt_longer_than_it_alone_and_stops_at_its_requests():
    """A prompt longer than a pass goes alone (else it would never go ahead), full as it is; a pass of exactly its
    positions is full without a next request, and one of its requests stops at them whatever positions are left."""
    scheduler = make_scheduler(num_kv_blocks=128, max_num_seqs=8, max_model_len=64, idle_prefill_tokens=64)

    def passed(max_tokens: int, max_seqs: int) -> list[str]:
        seqs = scheduler.admit_ahead(max_tokens, max_seqs)
        for seq in seqs:  # prefilled (EngineCore.prefill_ahead): not decoding
            seq.num_cached = seq.num_prompt
        return [seq.request_id for seq in seqs]

    scheduler.add(make_seq("long", num_prompt=40))
    assert passed(24, 4) == ["long"]
    for name, positions in [("a", 10), ("b", 14), ("c", 4), ("d", 4), ("e", 4)]:
        scheduler.add(make_seq(name, num_prompt=positions))
    assert passed(24, 4) == ["a", "b"]  # exactly 24
    assert passed(24, 2) == ["c", "d"]  # 8 positions, two requests
    assert passed(24, 2) == []  # "e" alone: part-filled
    check_invariants(scheduler)


def test_the_idle_budget_is_never_below_the_step_budget():
    scheduler = make_scheduler(max_prefill_tokens=20, idle_prefill_tokens=8)
    for name in "ab":
        scheduler.add(make_seq(name, num_prompt=10))
    assert [seq.request_id for seq in scheduler.schedule()] == ["a", "b"]
    long = make_scheduler(max_prefill_tokens=8, idle_prefill_tokens=12)
    long.add(make_seq("long", num_prompt=20))  # longer than either budget: alone, at once
    long.add(make_seq("short", num_prompt=4))
    assert [seq.request_id for seq in long.schedule()] == ["long"]


def test_the_default_idle_budget_is_96_positions_a_slot_at_least_16384():
    assert make_scheduler(idle_prefill_tokens=None, max_num_seqs=64).idle_prefill_tokens == 16384
    assert make_scheduler(idle_prefill_tokens=None, max_num_seqs=1024).idle_prefill_tokens == 96 * 1024
    wide = make_scheduler(idle_prefill_tokens=None, max_num_seqs=8, max_prefill_tokens=20_000)
    assert wide.idle_prefill_tokens == 20_000  # never below the step budget


def test_an_idle_engine_admits_past_a_pacing_hold_and_ends_it():
    clock = FakeClock()
    pacer = make_pacer(clock, max_prefill_tokens=16)
    pacer.record(decode_rows=0, admitted_positions=100, seconds=0.1)  # 1 ms a prompt position
    pacer.record(decode_rows=2, admitted_positions=0, seconds=0.02)  # 20 ms a decode step
    scheduler = make_scheduler(128, pacer, max_num_seqs=8, max_prefill_tokens=16, idle_prefill_tokens=40)
    for name in "ab":
        scheduler.add(make_seq(name))
    step(scheduler)
    for name in "cde":
        scheduler.add(make_seq(name))
    clock.now = 0.085  # 75 ms of audio left: no room for an 8-position prompt, the pacer holds the queue
    assert not [seq for seq in step(scheduler)[0] if seq.is_prefill] and pacer._held_since is not None
    scheduler.abort("a")
    scheduler.abort("b")  # nothing decodes: the idle budget, whole
    assert [seq.request_id for seq in scheduler.schedule()] == ["c", "d", "e"]
    assert pacer._held_since is None


def test_admission_is_bounded_by_kv_blocks():
    # 8 prompt + 34 cap - 1 = 41 positions = 11 blocks of 4: one request at a time fits 16 blocks
    scheduler = make_scheduler(num_kv_blocks=16)
    scheduler.add(make_seq("a", num_target_tokens=4))
    scheduler.add(make_seq("b", num_target_tokens=4))
    assert [seq.request_id for seq in scheduler.schedule()] == ["a"]
    assert [seq.request_id for seq in scheduler.waiting] == ["b"]
    scheduler.abort("a")
    assert [seq.request_id for seq in scheduler.schedule()] == ["b"]


def test_cancel_returns_blocks_and_slots():
    scheduler = make_scheduler()
    free_blocks, free_slots = list(scheduler.block_manager.free_block_ids), list(scheduler.free_slots)
    for name in "abcdef":
        scheduler.add(make_seq(name))
    step(scheduler)
    scheduler.pause("b")
    step(scheduler)
    for name in "fbadec":  # queued, paused, running, ...
        assert scheduler.abort(name).finish_reason is FinishReason.CANCELLED
        check_invariants(scheduler)
    assert scheduler.abort("a") is None  # idempotent
    assert sorted(scheduler.block_manager.free_block_ids) == sorted(free_blocks)
    assert sorted(scheduler.free_slots) == sorted(free_slots)
    assert not scheduler.requests and not scheduler.running and not scheduler.waiting
    assert not scheduler.has_work()


def test_no_stop_before_min_patches():
    scheduler = make_scheduler()
    seq = make_seq("a", params=GenerationParams(min_patches=2))
    scheduler.add(seq)
    for _ in range(3):  # patch indices 0, 1, 2: the stop head is ignored
        _, finished = step(scheduler, [True])
        assert not finished
    _, finished = step(scheduler, [True])  # index 3 > min_patches
    assert finished == [seq] and seq.finish_reason is FinishReason.STOP and seq.num_generated == 4


def test_length_caps():
    scheduler = make_scheduler(max_model_len=200, max_patches=50)
    text_cap = make_seq("text", num_target_tokens=3)  # 6 * 3 + 10 = 28
    absolute_cap = make_seq("absolute", num_target_tokens=30)  # 190 -> 50
    explicit = make_seq("explicit", params=GenerationParams(max_patches=5))
    model_len = make_seq("model_len", num_prompt=180, num_target_tokens=30)  # 200 - 180 + 1 = 21
    for seq in (text_cap, absolute_cap, explicit, model_len):
        scheduler.add(seq)
    assert [text_cap.max_patches, absolute_cap.max_patches, explicit.max_patches, model_len.max_patches] == [
        28,
        50,
        5,
        21,
    ]
    assert model_len.num_reserved_positions == 200
    scheduler.abort("text")
    scheduler.abort("absolute")
    scheduler.abort("model_len")
    for _ in range(4):
        assert not step(scheduler)[1]
    assert step(scheduler)[1] == [explicit] and explicit.finish_reason is FinishReason.LENGTH


def test_rejects_what_can_never_run():
    scheduler = make_scheduler(max_model_len=32)
    with pytest.raises(ValueError, match="max_model_len"):
        scheduler.add(make_seq("long", num_prompt=32))
    small_pool = make_scheduler(num_kv_blocks=2)
    with pytest.raises(ValueError, match="KV blocks"):
        small_pool.add(make_seq("a"))
    scheduler.add(make_seq("a"))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add(make_seq("a"))
    assert list(scheduler.requests) == ["a"]


def test_invariants_hold_under_random_traffic():
    rng = random.Random(0)
    scheduler = make_scheduler(num_kv_blocks=40, max_num_seqs=6, max_prefill_tokens=24)
    names = iter(range(10**6))
    for _ in range(400):
        for _ in range(rng.choice([0, 0, 1, 2])):
            params = GenerationParams(max_patches=rng.randint(1, 12), min_patches=rng.randint(0, 3))
            scheduler.add(make_seq(str(next(names)), num_prompt=rng.randint(2, 30), params=params))
        known = list(scheduler.requests)
        if known and rng.random() < 0.15:
            scheduler.abort(rng.choice(known))
        if known and rng.random() < 0.3:
            scheduler.pause(rng.choice(known))
        if known and rng.random() < 0.3:
            scheduler.resume(rng.choice(known))
        check_invariants(scheduler)
        paused = [seq for seq in scheduler.running if seq.status is SequenceStatus.PAUSED]
        running = [seq for seq in scheduler.running if seq.status is SequenceStatus.RUNNING]
        has_work = scheduler.has_work()
        batch = scheduler.schedule()
        assert has_work == bool(batch)
        assert not set(batch) & set(paused), "a paused request was stepped"
        assert set(running) <= set(batch)
        assert all(len(seq.block_table) * 4 >= seq.num_positions for seq in batch)
        finished = scheduler.postprocess(batch, [rng.random() < 0.1 for _ in batch])
        assert all(seq.status is SequenceStatus.FINISHED and not seq.block_table for seq in finished)
        check_invariants(scheduler)


def test_pacing_admits_fewer_while_streams_are_short_of_audio_and_all_when_idle():
    clock = FakeClock()
    pacer = make_pacer(clock, max_prefill_tokens=32)  # margin 50 ms
    pacer.record(decode_rows=0, admitted_positions=100, seconds=0.1)  # 1 ms a prompt position
    pacer.record(decode_rows=3, admitted_positions=0, seconds=0.02)  # 20 ms a decode step
    scheduler = make_scheduler(num_kv_blocks=128, max_num_seqs=8, pacer=pacer)
    for name in "abc":
        scheduler.add(make_seq(name))
    assert [seq.request_id for seq in step(scheduler)[0]] == ["a", "b", "c"]  # idle: the whole burst
    for name in "def":
        scheduler.add(make_seq(name))
    clock.now = 0.085  # 75 ms of audio left: room for 5 ms of prefill, under one 8-position prompt
    assert [seq.request_id for seq in step(scheduler)[0]] == ["a", "b", "c"]
    clock.now = 0.1  # one more patch each: 220 ms left, room for all
    assert [seq.request_id for seq in step(scheduler)[0]] == ["a", "b", "c", "d", "e", "f"]
    for name in "def":
        scheduler.pause(name)
    scheduler.add(make_seq("g"))
    clock.now = 0.25  # d, e, f have 10 ms left but are paused: a, b, c's 230 ms decide
    assert [seq.request_id for seq in step(scheduler)[0]] == ["a", "b", "c", "g"]
    check_invariants(scheduler)
