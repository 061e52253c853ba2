from __future__ import annotations

from collections import defaultdict

import pytest

from wsserver.opus_load import FIRST_S, IDLE_S, WINDOW_S, OpusComplexity


class Load:
    """A worker's loop on a fake clock: it encodes `per_s` frames a second at the governor's level, each costing
    `cost[level]` seconds, and spends `other` seconds of CPU per second on everything else."""

    def __init__(self, cost: dict[int, float], other: float) -> None:
        self.cost, self.other = cost, other
        self.now = self.cpu = 0.0

    def clock(self) -> float:
        return self.cpu

    def window(self, governor: OpusComplexity, per_s: int = 100) -> int:
        """One window of load; the level the governor chose at its end."""
        start, frames = self.now, round(per_s * WINDOW_S)
        for i in range(1, frames + 1):
            level = governor.level_for(1.0)  # as a stream's encoder reads it before each frame (past its first)
            seconds = self.cost[level]
            self.cpu += seconds + self.other * WINDOW_S / frames
            self.now = start + WINDOW_S * i / frames + (1e-9 if i == frames else 0.0)  # the last frame ends it
            governor.encoded(seconds, self.now, level)
        return governor.level

    def pause(self, seconds: float) -> None:
        self.now += seconds


# A frame's cost per level (at 100 frames a second, two streams' worth: a slow machine's). 10 costs 1.78x 6 here, where
# relative_cost, the governor's guess until it has measured, says 2.22x.
COST = {10: 0.0064, 6: 0.0036, 5: 0.0036, 4: 0.0022, 2: 0.0021, 0: 0.0013}


def governor(load: Load, ceiling: int = 10, floor: int = 4) -> OpusComplexity:
    return OpusComplexity(ceiling, floor, cpu_clock=load.clock, now=load.now)


def test_it_starts_at_6_and_climbs_to_the_ceiling_while_the_loop_has_room() -> None:
    load = Load(COST, other=0.05)
    opus = governor(load)
    assert opus.levels == [10, 6, 4] and opus.level == 6
    assert [load.window(opus, per_s=20) for _ in range(3)] == [10, 10, 10]


def test_a_busy_loop_steps_down_a_plateau_a_window_to_the_floor() -> None:
    load = Load(COST, other=0.05)
    opus = governor(load)
    assert load.window(opus, per_s=20) == 10
    load.other = 0.3  # at 10: 0.3 + 0.64 of a core, nearly all the loop has
    assert [load.window(opus) for _ in range(4)] == [6, 4, 4, 4]  # 6: 0.66 busy, still over; 4 is the floor


def test_it_steps_back_up_only_to_a_level_the_loop_can_carry() -> None:
    load = Load(COST, other=0.05)
    opus = governor(load)
    assert load.window(opus, per_s=20) == 10
    load.other = 0.3
    assert [load.window(opus) for _ in range(3)] == [6, 4, 4]
    load.other = 0.0  # the other work went away: at 6 the loop would be 0.36 busy, at 10 0.64
    assert [load.window(opus) for _ in range(4)] == [6, 6, 6, 6]  # 10 would not fit: no flapping
    # Fewer streams: at 6 the loop is 0.23 busy, and at 10 it would be 0.41 by the costs measured (0.51 by the guess).
    assert load.window(opus, per_s=64) == 10


def test_after_a_pause_it_starts_again_at_6() -> None:
    """A burst after a quiet spell meets a worker at 6, not at the 10 a lone stream had climbed to; the first frame
    after the pause opens a window, so the quiet spell does not count as room."""
    load = Load(COST, other=0.0)
    opus = governor(load)
    assert load.window(opus, per_s=20) == 10
    load.pause(IDLE_S + 0.1)
    load.other = 0.3
    assert [load.window(opus) for _ in range(2)] == [6, 4]
    load.pause(IDLE_S / 2)  # shorter than IDLE_S: the level stays, and the pause is not taken for room
    assert [load.window(opus) for _ in range(2)] == [4, 4]


def test_a_streams_first_frames_are_encoded_at_most_at_the_start_level() -> None:
    """A burst meeting a worker whose few streams keep it at 10: the newcomers' first FIRST_S go at 6 (the level a
    worker starts at), counted at 6, and 10's measured cost stays 10's."""
    load = Load(COST, other=0.05)
    counts: defaultdict[int, int] = defaultdict(int)
    opus = OpusComplexity(10, 4, counts=counts, cpu_clock=load.clock, now=load.now)
    assert load.window(opus, per_s=20) == 10
    assert [opus.level_for(s) for s in (0.0, FIRST_S - 0.02, FIRST_S, 5.0)] == [6, 6, 10, 10]
    before = dict(counts)
    for i in range(1, 21):  # a window: 10 frames of streams under way, 10 first frames of new ones
        audio_s = 1.0 if i % 2 else 0.0
        level = opus.level_for(audio_s)
        load.cpu += COST[level]
        load.now += WINDOW_S / 20 + (1e-9 if i == 20 else 0.0)
        opus.encoded(COST[level], load.now, level)
    assert {level: counts[level] - before.get(level, 0) for level in counts} == {10: 10, 6: 10}
    assert opus.level == 10 and opus._cost[10] == pytest.approx(COST[10])  # not the mix's average
    # A busy window of nothing but new streams' first frames, at a level not yet measured here: a guess, no failure.
    load.other = 0.05
    fresh = OpusComplexity(10, 4, cpu_clock=load.clock, now=load.now)
    assert load.window(fresh, per_s=20) == 10  # 6 measured, 10 not yet
    for i in range(1, 21):
        load.cpu += COST[6] + 0.8 * WINDOW_S / 20
        load.now += WINDOW_S / 20 + (1e-9 if i == 20 else 0.0)
        fresh.encoded(COST[6], load.now, fresh.level_for(0.0))
    assert fresh.level == 10  # nothing encoded at 10 in that window: no saving to step down for
    low = OpusComplexity(5, 2)  # a ceiling under 6: its start level is the ceiling
    assert low.level_for(0.0) == low.level_for(1.0) == 5


def test_a_loop_busy_with_other_work_keeps_its_complexity() -> None:
    load = Load(COST, other=0.9)
    opus = governor(load)
    assert [load.window(opus, per_s=10) for _ in range(3)] == [6, 6, 6]  # lowering would save under 5 % of a core


def test_a_floor_at_the_ceiling_fixes_the_complexity_and_frames_are_counted_by_level() -> None:
    load = Load(COST, other=0.9)
    counts: defaultdict[int, int] = defaultdict(int)
    opus = OpusComplexity(5, 5, counts=counts, cpu_clock=load.clock, now=load.now)
    assert [load.window(opus) for _ in range(3)] == [5, 5, 5]
    assert counts == {5: 3 * round(100 * WINDOW_S)}
    assert OpusComplexity(2, 4).levels == [2]  # a floor above the ceiling: the ceiling


@pytest.mark.parametrize(
    ("ceiling", "floor", "levels", "start"),
    [(10, 0, [10, 6, 4, 0], 6), (9, 5, [9, 6, 5], 6), (6, 2, [6, 4, 2], 6), (5, 2, [5, 4, 2], 5), (10, 8, [10, 8], 8)],
)
def test_levels_are_the_plateau_tops_between_ceiling_and_floor(
    ceiling: int, floor: int, levels: list[int], start: int
) -> None:
    opus = OpusComplexity(ceiling, floor)
    assert opus.levels == levels and opus.level == start
