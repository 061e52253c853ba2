from __future__ import annotations

from wsserver.admission import SlotQueue


def test_fifo_with_continuations_first() -> None:
    queue: SlotQueue[str] = SlotQueue(slots=1)
    assert queue.acquire("a0", continuing=False)
    assert not queue.acquire("b0", continuing=False)
    assert not queue.acquire("c0", continuing=False)
    assert not queue.acquire("a1", continuing=True)  # a's next segment: its audio is playing
    assert queue.waiting == ["a1", "b0", "c0"]
    assert queue.release("a0") == ["a1"]
    assert queue.release("c0") == []  # leaving the queue grants nothing while the slot is taken
    assert queue.release("a1") == ["b0"]
    assert queue.waiting == [] and queue.holders == {"b0"}
