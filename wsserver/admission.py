"""Engine-slot admission shared by every session: a fair FIFO in front of the engine's `max_num_seqs` slots.

A context holds a slot while one of its segments generates and gives it back in between, so a context idling for
LLM tokens costs nobody a slot. Segments that continue a context already speaking wait in front of first segments:
their audio is playing and runs out if they wait, while a newcomer only starts later.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class SlotQueue(Generic[T]):
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.holders: set[T] = set()
        self._continuing: deque[T] = deque()  # continuations, first come first served
        self._new: deque[T] = deque()  # first segments of contexts, first come first served

    @property
    def waiting(self) -> list[T]:
        """Tickets waiting, in the order they will be granted."""
        return [*self._continuing, *self._new]

    def acquire(self, ticket: T, continuing: bool) -> bool:
        """Take a slot for `ticket`, or queue it. True if granted at once."""
        if len(self.holders) < self.slots and not self._continuing and not self._new:
            self.holders.add(ticket)
            return True
        (self._continuing if continuing else self._new).append(ticket)
        return False

    def release(self, ticket: T) -> list[T]:
        """Give back `ticket`'s slot (or its place in the queue). Returns the tickets granted in consequence."""
        if ticket in self.holders:
            self.holders.remove(ticket)
        elif ticket in self._continuing:
            self._continuing.remove(ticket)
        elif ticket in self._new:
            self._new.remove(ticket)
        granted = []
        while len(self.holders) < self.slots and (self._continuing or self._new):
            nxt = (self._continuing or self._new).popleft()
            self.holders.add(nxt)
            granted.append(nxt)
        return granted
