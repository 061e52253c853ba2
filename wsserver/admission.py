"""Engine-slot admission shared by every session of the server: a fair FIFO in front of the slots of every engine.

A context holds a slot while one of its segments generates and gives it back in between, so a context idling for
LLM tokens costs nobody a slot. Segments that continue a context already speaking wait in front of first segments:
their audio is playing and runs out if they wait, while a newcomer only starts later. A granted segment goes to the
engine with the most free slots (the least outstanding work: every slot holds one generating segment); a segment's
context carries its voice and prompt itself, so consecutive segments may run on different engines.

A spare is a slot held in advance for a front end that reaches the queue over a socket (wsserver.coordinator): its
next segment starts on it without the round trip. Spares are held only while nobody waits and at most half the slots
are taken, so they never keep a segment waiting for longer than it takes to call one back.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class SlotQueue(Generic[T]):
    def __init__(self, engine_slots: list[int]) -> None:
        self.capacity = list(engine_slots)  # per engine; 0 for an engine that is down
        self.holders: dict[T, int] = {}  # ticket -> the engine whose slot it holds
        self.spares: dict[T, int] = {}  # the holders that are spares, not yet a segment's
        self._used = [0] * len(engine_slots)
        self.granted = [0] * len(engine_slots)  # per engine: segments granted so far (how the routing spread them)
        self._continuing: deque[T] = deque()  # continuations, first come first served
        self._new: deque[T] = deque()  # first segments of contexts, first come first served
        self._avoid: dict[T, int] = {}  # ticket -> an engine it must not get (the one that just failed its segment)

    @property
    def slots(self) -> int:
        return sum(self.capacity)

    @property
    def used(self) -> list[int]:
        """Per engine: the slots held now, spares included."""
        return list(self._used)

    @property
    def generating(self) -> list[int]:
        """Per engine: the slots its generating segments hold (spares left out)."""
        counts = list(self._used)
        for engine in self.spares.values():
            counts[engine] -= 1
        return counts

    @property
    def waiting(self) -> list[T]:
        """Tickets waiting, in the order they will be granted."""
        return [*self._continuing, *self._new]

    def acquire(self, ticket: T, continuing: bool, avoid: int | None = None) -> int | None:
        """Take a slot for `ticket` (the engine's index), or queue it (None). `avoid`: an engine not to grant it, for a
        segment moving off an engine that died under it, which may still look healthy here for a moment (the worker
        sees its connection drop first); granted there, the segment would fail again."""
        if avoid is not None:
            self._avoid[ticket] = avoid
        # Every waiting ticket is blocked (each change grants what it can): room this one may take is nobody's turn.
        if (engine := self._roomiest(avoid)) is not None:
            self._grant(ticket, engine)
            return engine
        (self._continuing if continuing else self._new).append(ticket)
        return None

    def spare(self, ticket: T) -> int | None:
        """Hold a slot for `ticket` in advance (the engine's index), if nobody waits and at most half the slots would
        then be held; else None. It counts as granted once `claim`ed."""
        if self._continuing or self._new or 2 * (sum(self._used) + 1) > self.slots:
            return None
        if (engine := self._roomiest()) is not None:
            self.holders[ticket] = self.spares[ticket] = engine
            self._used[engine] += 1
        return engine

    def claim(self, ticket: T) -> None:
        """Spare `ticket` is a segment's slot from now on."""
        if (engine := self.spares.pop(ticket, None)) is not None:
            self.granted[engine] += 1

    def release(self, ticket: T) -> list[tuple[T, int]]:
        """Give back `ticket`'s slot (or its place in the queue). Returns the tickets granted in consequence."""
        self._avoid.pop(ticket, None)
        self.spares.pop(ticket, None)
        if ticket in self.holders:
            self._used[self.holders.pop(ticket)] -= 1
        elif ticket in self._continuing:
            self._continuing.remove(ticket)
        elif ticket in self._new:
            self._new.remove(ticket)
        return self._grant_waiting()

    def set_capacity(self, engine: int, slots: int) -> list[tuple[T, int]]:
        """An engine's slots changed (0: it is down; its holders keep theirs until they release them)."""
        self.capacity[engine] = slots
        return self._grant_waiting()

    def _grant_waiting(self) -> list[tuple[T, int]]:
        """In queue order; a ticket whose only engine with room is the one it avoids keeps its place, and the tickets
        behind it may take that room."""
        granted = []
        for line in (self._continuing, self._new):
            for ticket in list(line):
                if (engine := self._roomiest(self._avoid.get(ticket))) is None:
                    if self._roomiest() is None:
                        return granted
                    continue
                line.remove(ticket)
                self._grant(ticket, engine)
                granted.append((ticket, engine))
        return granted

    def _grant(self, ticket: T, engine: int) -> None:
        self.holders[ticket] = engine
        self._used[engine] += 1
        self.granted[engine] += 1

    def _roomiest(self, avoid: int | None = None) -> int | None:
        free = [capacity - used for capacity, used in zip(self.capacity, self._used, strict=True)]
        engines = [engine for engine in range(len(free)) if engine != avoid]
        best = max(engines, key=free.__getitem__, default=None)
        return best if best is not None and free[best] > 0 else None


@dataclass(slots=True)
class _Bucket:
    tokens: float
    last: float


class ClientLimits:
    """Per client (an address): seats held at once, and new seats per second (a token bucket bursting to twice the
    rate). 0 turns a limit off. One client, a crawler or a runaway loop, cannot take every seat or flood the
    handshakes; a proxy's clients are told apart only if the proxy is trusted (wsserver.access)."""

    def __init__(self, max_seats: int, per_second: float) -> None:
        self.max_seats, self.per_second = max_seats, per_second
        self.seats: Counter[str] = Counter()
        self._buckets: dict[str, _Bucket] = {}

    def take(self, client: str, now: float) -> str | None:
        """A seat for `client`, or why not: "client_full" or "client_rate"."""
        if self.max_seats and self.seats[client] >= self.max_seats:
            return "client_full"
        if self.per_second:
            burst = 2 * self.per_second
            bucket = self._buckets.setdefault(client, _Bucket(burst, now))
            bucket.tokens = min(burst, bucket.tokens + (now - bucket.last) * self.per_second)
            bucket.last = now
            if bucket.tokens < 1:
                return "client_rate"
            bucket.tokens -= 1
            if len(self._buckets) > 4096:
                self._forget_full(now, burst)
        self.seats[client] += 1
        return None

    def free(self, client: str) -> None:
        if self.seats[client] > 0:
            self.seats[client] -= 1
        if not self.seats[client]:
            del self.seats[client]

    def _forget_full(self, now: float, burst: float) -> None:
        """Drop the buckets that have refilled: they hold nothing a new one would not."""
        for client in [c for c, b in self._buckets.items() if b.tokens + (now - b.last) * self.per_second >= burst]:
            del self._buckets[client]
