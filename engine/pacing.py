"""Admission pacing: how many prompt positions the next step may prefill without running a playing stream dry.

A step decodes every running stream and prefills the admissions in the same batch, so an admission stretches the
step that every stream waits for. A burst on an idle engine is admitted in one step (nobody is playing yet), but the
next waves arrive while the first one plays: a stream that started one step ago holds one patch of audio (160 ms for
VoxCPM2), and a step admitting `max_prefill_tokens` positions at B=256 takes ~300 ms, so its player runs dry.

The pacer budgets each step's prefill from the streams' slack: the audio a stream has been sent, less the wall time
since its consumer started playing (taken as the emission of its first chunk: a client plays from its first frame).
The next step must end before the stream with the least slack runs dry, with `pacing_margin_ms` to spare for delivery:

    budget = (min slack - margin - decode estimate) / seconds per admitted prompt position

clamped to [0, max_prefill_tokens]. Both estimates are learned from the steps' own durations (EMAs): a decode step's
time per batch-size bucket from steps that admitted nothing, the cost of a prompt position from admitting steps as
their time beyond the decode estimate over their positions (a ratio of averages, so that a small admission's fixed
cost does not read as a dear position). Until both exist, and while no running stream has emitted, the budget is the
full `max_prefill_tokens`; an idle engine's step admits up to the scheduler's `idle_prefill_tokens`, unpaced.

Rules, and why:
- A stream already behind (negative slack) counts as having none, rather than not counting: the streams admitted in
  one step share their anchor and cross zero together, and if they stopped counting the budget would jump to the
  full one exactly then, turning a small overrun into a full admission's stall. While the engine decodes faster than
  real time, a step that admits nothing gives every stream `patch - decode` more audio, so it recovers in a few steps.
- Paused streams do not count (they are not stepped). A resumed stream's consumer buffer is unknown: its anchor
  restarts at the resume, holding one patch (the least a consumer that was being fed can hold).
- Progress: when the budget is below the head request's prompt, pacing holds the queue at most `pacing_max_hold_ms`
  (default 500 ms, about three VoxCPM2 patches), then the head is admitted alone. Ordinary holds last a step or two
  (each held step gains the streams ~90 ms at B=256); the cap matters when the engine decodes at about real time or
  slower, where holding cannot save the streams and the queue must still move.
- An unmeasured batch size is estimated from the nearest larger measured one (a larger batch is no faster), else in
  proportion from the largest measured (an overestimate: a step has fixed costs). Erring high holds admissions for
  one step, and that step measures the size.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.config import EngineConfig
from engine.sequence import Sequence

_EMA = 0.2  # weight of the newest step in the learned estimates
_BUCKET_ROWS = 16  # decode time is learned per this many rows of batch size


class AdmissionPacer:
    def __init__(self, config: EngineConfig, patch_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_prefill_tokens = config.max_prefill_tokens
        self.patch_s = patch_s  # seconds of audio per generated patch
        self.margin_s = config.pacing_margin_ms / 1e3
        self.max_hold_s = config.pacing_max_hold_ms / 1e3
        self.clock = clock
        self._decode_s: dict[int, float] = {}  # decode-only step time per batch-size bucket
        self._extra_s: float | None = None  # admitting steps: time beyond the decode estimate (EMA)
        self._positions = 0.0  # admitting steps: admitted positions (EMA)
        self._held_since: float | None = None  # when pacing began holding the queue's head

    # Anchors: the only writer of Sequence.play_start / play_skipped.

    def emitted(self, seq: Sequence) -> None:
        """The request emitted a chunk (call after its step): its consumer starts playing at its first."""
        if seq.play_start is None:
            seq.play_start = self.clock()

    def resumed(self, seq: Sequence) -> None:
        """The request runs again after a pause: the consumer's buffer is unknown, so assume it holds one patch."""
        if seq.play_start is not None:
            seq.play_start = self.clock()
            seq.play_skipped = seq.num_generated - 1

    def slack_s(self, seq: Sequence, now: float) -> float:
        """Audio the consumer has left: what it was sent since its anchor, less the time since."""
        assert seq.play_start is not None
        return (seq.num_generated - seq.play_skipped) * self.patch_s - (now - seq.play_start)

    # Estimates.

    def decode_s(self, rows: int) -> float | None:
        """A decode-only step's time at this batch size; None until some decode step was measured."""
        if rows == 0:
            return 0.0
        if not self._decode_s:
            return None
        bucket = -(-rows // _BUCKET_ROWS)
        if bucket in self._decode_s:
            return self._decode_s[bucket]
        larger = [known for known in self._decode_s if known > bucket]
        if larger:
            return self._decode_s[min(larger)]
        top = max(self._decode_s)
        return self._decode_s[top] * bucket / top

    @property
    def position_s(self) -> float | None:
        """Seconds an admitted prompt position adds to a step; None until an admitting step was measured."""
        if self._extra_s is None:
            return None
        return self._extra_s / self._positions

    def record(self, decode_rows: int, admitted_positions: int, seconds: float) -> None:
        """Learn from a finished step: `decode_rows` streams decoded and `admitted_positions` prompt positions."""
        bucket = -(-decode_rows // _BUCKET_ROWS)
        if not admitted_positions:
            old = self._decode_s.get(bucket)
            self._decode_s[bucket] = seconds if old is None else (1 - _EMA) * old + _EMA * seconds
            return
        # Only against a measured decode time: an extrapolated one would misread the admission's own cost.
        decode = 0.0 if decode_rows == 0 else self._decode_s.get(bucket)
        if decode is None:
            return
        extra = max(0.0, seconds - decode)
        if self._extra_s is None:
            self._extra_s, self._positions = extra, float(admitted_positions)
        else:
            self._extra_s = (1 - _EMA) * self._extra_s + _EMA * extra
            self._positions = (1 - _EMA) * self._positions + _EMA * admitted_positions

    # The budget.

    def budget(self, rows: list[Sequence], head_positions: int) -> int:
        """Prompt positions the next step may admit; `rows` are the running (not paused) requests it decodes,
        `head_positions` the queue head's prompt."""
        full = self.max_prefill_tokens
        playing = [seq for seq in rows if seq.play_start is not None]
        decode, position = self.decode_s(len(rows)), self.position_s
        if not playing or decode is None or position is None:
            self._held_since = None
            return full
        now = self.clock()
        slack = max(0.0, min(self.slack_s(seq, now) for seq in playing))
        room = slack - self.margin_s - decode
        budget = full if position == 0 else min(full, max(0, int(room / position)))
        if budget >= head_positions:
            self._held_since = None
            return budget
        if self._held_since is None:
            self._held_since = now
        elif now - self._held_since >= self.max_hold_s:
            self._held_since = None  # the head goes in alone (a prompt above the full budget: alone as ever)
            return min(head_positions, full)
        return budget
