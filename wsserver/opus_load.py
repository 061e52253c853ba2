"""Opus encoder complexity under load: a front end lowers it while its event loop is short of CPU, and raises it once
the higher level fits, as WebRTC's encoders adapt to CPU overuse. Sans-I/O but for the thread's CPU clock.

libopus's encoder is most of a front end's CPU at scale: on an H200's host, 512 Opus streams at 48 kHz kept 14 workers
83-87 % busy at complexity 10 and about a third of that at 5, and at 10 hundreds of players ran dry. The complexity is
a per-frame setting of the encoder (OPUS_SET_COMPLEXITY), so every stream of a worker follows the worker's level from
its next frame on; the bitstream stays valid whatever the level.

Every WINDOW_S of encoding the governor compares the loop thread's CPU time with the wall clock. Above BUSY_HIGH it
steps down a level, if that saves enough; below, it steps up once the loop would stay under BUSY_LOW at the level
above, predicted from what each level's frames cost on this worker (measured; until then, `relative_cost`). The levels
are the top of each of libopus's cost plateaus (0, 1-4, 5-6, 7-10: measured at 48 kHz mono, 32-64 kbit/s), so each
step changes the cost and keeps the best quality at it.

A pause in encoding longer than a window opens a new window at its end, so that the pause does not count as room. A
worker starts, and starts again after IDLE_S without encoding, at START (or the nearest level below): a burst of
sessions brings every stream's first chunk at once, the moment a player is closest to running dry, and a worker that
met it at 10 learnt of its load only after those chunks (on the H200, 85-100 of 512 sessions starved at 0.14 s of
their audio with a governor that started at 10 and measured over 0.2 s; 1-2 with the complexity fixed at 5; 8, 15 and
0 in three runs starting at 6, docs/benchmarks.md). A lone stream climbs to the ceiling after one window.

A burst can also meet a worker that is not idle: one whose few streams keep it at 10 when dozens start at once (a
benchmark's warm-up level ending less than IDLE_S before its first measured level). On the H200, of four first 512
levels the ones with the most frames encoded at 10 starved the most (6,419 frames at 10: 460 sessions ran dry, most
at 0.08 s of their audio, which reads as a worker's turns over its streams' first chunks outlasting the 80 ms each
had been sent; 2,369: none; docs/benchmarks.md). So each stream's first FIRST_S of audio is encoded at most at START,
whatever the worker's level: a burst's first chunks go out at the cost a worker starts at, and the level the worker
measured holds for everything after them. A lone stream's first 0.3 s is encoded at 6 instead of 10.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

WINDOW_S = 0.2
IDLE_S = 1.0
START = 6
FIRST_S = 0.3  # a stream's first this much audio is encoded at most at START: its first two chunks (VoxCPM2)
BUSY_HIGH = 0.6  # the loop thread's CPU share above which the complexity steps down
BUSY_LOW = 0.45  # the share the loop must be predicted to stay under at the level it steps up to
MIN_SAVING = 0.05  # the least CPU share (of a core) a step down must save to be worth the lost quality
PLATEAU_TOPS = (10, 6, 4, 0)


def relative_cost(complexity: int) -> float:
    """A frame's encoding cost at `complexity` relative to 10's, before this worker has measured it."""
    if complexity >= 7:
        return 1.0
    if complexity >= 5:
        return 0.45
    return 0.27 if complexity >= 1 else 0.16


class OpusComplexity:
    """A front end's Opus complexity: its encoders read `level` before each frame and report what it cost."""

    def __init__(
        self,
        ceiling: int,
        floor: int,
        counts: defaultdict[int, int] | None = None,
        cpu_clock: Callable[[], float] = time.thread_time,
        now: float | None = None,
    ) -> None:
        """Levels from `ceiling` down to `floor` (a floor above the ceiling: the ceiling, fixed); `counts`: where to
        count the frames encoded, by complexity (ServerMetrics.opus_frames); `now`: on time.perf_counter()."""
        assert 0 <= ceiling <= 10 and 0 <= floor <= 10
        floor = min(floor, ceiling)
        self.levels = sorted({ceiling, floor, *(top for top in PLATEAU_TOPS if floor < top < ceiling)}, reverse=True)
        self.start = max((level for level in self.levels if level <= START), default=floor)
        self.level = self.start
        self.frames = counts if counts is not None else defaultdict(int)
        self._cpu_clock = cpu_clock
        self._cost: dict[int, float] = {}  # seconds per frame, by level, as last measured here
        self._start = self._last = time.perf_counter() if now is None else now
        self._cpu_start = cpu_clock()
        self._encode_s = 0.0
        self._window_frames = 0

    def level_for(self, audio_s: float) -> int:
        """The complexity for a stream's frame that starts `audio_s` into its audio (module docstring)."""
        return min(self.level, self.start) if audio_s < FIRST_S else self.level

    def encoded(self, seconds: float, now: float, level: int) -> None:
        """A frame was encoded at `level` (as `level_for` said) in `seconds` (wall clock); `now`:
        time.perf_counter() after it. The governor's level changes only here."""
        self.frames[level] += 1
        if (gap := now - self._last) > WINDOW_S:  # the first frame after a pause: measure the load from now on
            if gap > IDLE_S:
                self.level = self.start
            self._restart(now, self._cpu_clock())
            return
        self._last = now
        if level == self.level:  # a stream's first frames, cheaper, would understate this level's cost
            self._encode_s += seconds
            self._window_frames += 1
        if now - self._start >= WINDOW_S:
            self._decide(now)

    def _decide(self, now: float) -> None:
        cpu = self._cpu_clock()
        wall = now - self._start
        busy = (cpu - self._cpu_start) / wall
        encoding = self._encode_s / wall  # the share of a core spent encoding at this level
        if self._window_frames:
            self._cost[self.level] = self._encode_s / self._window_frames
        index = self.levels.index(self.level)
        if busy > BUSY_HIGH and index + 1 < len(self.levels):
            lower = self.levels[index + 1]
            if encoding * (1 - self._ratio(lower)) >= MIN_SAVING:
                self.level = lower
        elif busy <= BUSY_HIGH and index > 0:
            higher = self.levels[index - 1]
            if busy + encoding * (self._ratio(higher) - 1) < BUSY_LOW:
                self.level = higher
        self._restart(now, cpu)

    def _restart(self, now: float, cpu: float) -> None:
        self._start = self._last = now
        self._cpu_start = cpu
        self._encode_s, self._window_frames = 0.0, 0

    def _ratio(self, other: int) -> float:
        """What a frame costs at `other` over what it costs at the current level: measured where both are (a window
        of only streams' first frames measures no level), else `relative_cost`'s guess."""
        if other in self._cost and self.level in self._cost:
            return self._cost[other] / self._cost[self.level]
        return relative_cost(other) / relative_cost(self.level)
