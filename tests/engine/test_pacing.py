import pytest

from engine.pacing import AdmissionPacer
from tests.engine.helpers import PATCH_S, FakeClock, make_pacer, make_seq


def trained(clock: FakeClock, **overrides) -> AdmissionPacer:
    """A pacer that knows a decode step at up to 16 rows takes 20 ms and a prompt position 0.1 ms."""
    pacer = make_pacer(clock, **overrides)
    pacer.record(decode_rows=0, admitted_positions=1000, seconds=0.1)
    pacer.record(decode_rows=4, admitted_positions=0, seconds=0.02)
    return pacer


def playing(pacer: AdmissionPacer, name: str, patches: int = 1):
    """A running request that emitted `patches` chunks, the first now."""
    seq = make_seq(name)
    seq.num_generated = patches
    pacer.emitted(seq)
    return seq


def test_full_budget_until_a_stream_plays_and_both_estimates_exist():
    clock = FakeClock()
    pacer = make_pacer(clock)
    seq = playing(pacer, "a")
    assert pacer.budget([seq], 8) == 4000  # nothing measured
    pacer.record(decode_rows=4, admitted_positions=0, seconds=0.02)
    assert pacer.budget([seq], 8) == 4000  # no admission measured
    pacer.record(decode_rows=0, admitted_positions=1000, seconds=0.1)
    assert pacer.budget([seq], 8) < 4000
    assert pacer.budget([], 8) == 4000  # idle engine: a burst goes in as without pacing
    assert pacer.budget([make_seq("not yet emitted")], 8) == 4000


def test_budget_is_the_least_slack_less_margin_and_decode_over_the_position_cost():
    clock = FakeClock()
    pacer = trained(clock)
    a = playing(pacer, "a")
    # slack 160 ms - margin 50 - decode 20 = 90 ms of prefill at 0.1 ms a position
    assert pacer.budget([a], 8) == pytest.approx(900, abs=1)
    clock.now = 0.05
    assert pacer.budget([a], 8) == pytest.approx(400, abs=1)
    b = playing(pacer, "b", patches=3)  # anchored now, with more audio: a has the least
    assert pacer.budget([a, b], 8) == pytest.approx(400, abs=1)
    a.num_generated = 30  # lots of audio ahead: clamped to max_prefill_tokens
    b.num_generated = 30
    assert pacer.budget([a, b], 8) == 4000


def test_a_stream_behind_counts_as_having_no_audio():
    clock = FakeClock()
    pacer = trained(clock)
    behind, ahead = playing(pacer, "behind"), playing(pacer, "ahead", patches=30)
    clock.now = 0.3
    assert pacer.slack_s(behind, clock.now) < 0
    assert pacer.budget([behind, ahead], 0) == 0  # not the full budget: that would stall it longest


def test_decode_time_is_learned_per_bucket_and_extrapolated_upwards():
    pacer = make_pacer(FakeClock())
    assert pacer.decode_s(0) == 0.0 and pacer.decode_s(4) is None
    pacer.record(decode_rows=4, admitted_positions=0, seconds=0.02)
    pacer.record(decode_rows=16, admitted_positions=0, seconds=0.04)  # same bucket (1-16 rows): an EMA
    assert pacer.decode_s(10) == pytest.approx(0.8 * 0.02 + 0.2 * 0.04)
    pacer.record(decode_rows=64, admitted_positions=0, seconds=0.05)
    assert pacer.decode_s(40) == pytest.approx(0.05)  # unmeasured: the next larger measured bucket
    assert pacer.decode_s(128) == pytest.approx(0.05 * 2)  # beyond: in proportion to the rows


def test_position_cost_is_time_beyond_decode_over_positions_averaged_by_positions():
    pacer = make_pacer(FakeClock())
    assert pacer.position_s is None
    pacer.record(decode_rows=4, admitted_positions=100, seconds=0.5)
    assert pacer.position_s is None  # no decode time to take off yet: nothing learned
    pacer.record(decode_rows=4, admitted_positions=0, seconds=0.02)
    pacer.record(decode_rows=4, admitted_positions=1000, seconds=0.12)
    assert pacer.position_s == pytest.approx(0.1 / 1000)
    # A small admission's fixed cost weighs by its positions, not as one sample in ten.
    pacer.record(decode_rows=4, admitted_positions=10, seconds=0.03)
    expected = (0.8 * 0.1 + 0.2 * 0.01) / (0.8 * 1000 + 0.2 * 10)
    assert pacer.position_s == pytest.approx(expected)


def test_the_head_is_held_at_most_max_hold_then_admitted_alone():
    clock = FakeClock()
    pacer = trained(clock)
    seq = playing(pacer, "a")
    seq.play_start = -0.1  # 60 ms left: below margin + decode
    assert pacer.budget([seq], 8) == 0
    clock.now = 0.49
    seq.num_generated += 3  # keep its slack where it was, as held decode steps would not
    assert pacer.budget([seq], 8) == 0
    clock.now = 0.5
    assert pacer.budget([seq], 8) == 8  # the head alone
    assert pacer.budget([seq], 8) == 0  # and the next hold starts now
    clock.now = 0.99
    assert pacer.budget([seq], 8) == 0
    clock.now = 1.0
    assert pacer.budget([seq], 5000) == 4000  # a prompt above the full budget: the full budget (admitted alone)


def test_a_budget_that_fits_the_head_ends_the_hold():
    clock = FakeClock()
    pacer = trained(clock)
    seq = playing(pacer, "a")
    clock.now = 0.1
    assert pacer.budget([seq], 8) == 0  # held since 0.1
    seq.num_generated = 5
    clock.now = 0.4
    assert pacer.budget([seq], 8) > 8
    seq.num_generated = 1
    seq.play_start = 0.4
    clock.now = 0.5
    assert pacer.budget([seq], 8) == 0
    clock.now = 0.8  # 0.7 s after the first hold began, but this one began at 0.5
    assert pacer.budget([seq], 8) == 0


def test_a_resumed_stream_restarts_its_anchor_holding_one_patch():
    clock = FakeClock()
    pacer = trained(clock)
    seq = playing(pacer, "a", patches=10)
    clock.now = 5.0  # long paused: far behind by its first anchor
    pacer.resumed(seq)
    assert pacer.slack_s(seq, clock.now) == pytest.approx(PATCH_S)
    pacer.emitted(seq)  # later chunks do not move the anchor
    assert seq.play_start == 5.0
    seq.num_generated += 1
    clock.now = 5.1
    assert pacer.slack_s(seq, clock.now) == pytest.approx(2 * PATCH_S - 0.1)
