from __future__ import annotations

from wsserver.admission import SlotQueue


def test_fifo_with_continuations_first() -> None:
    queue: SlotQueue[str] = SlotQueue([1])
    assert queue.acquire("a0", continuing=False) == 0
    assert queue.acquire("b0", continuing=False) is None
    assert queue.acquire("c0", continuing=False) is None
    assert queue.acquire("a1", continuing=True) is None  # a's next segment: its audio is playing
    assert queue.waiting == ["a1", "b0", "c0"]
    assert queue.release("a0") == [("a1", 0)]
    assert queue.release("c0") == []  # leaving the queue grants nothing while the slot is taken
    assert queue.release("a1") == [("b0", 0)]
    assert queue.waiting == [] and queue.holders == {"b0": 0}


def test_segments_go_to_the_engine_with_the_most_room() -> None:
    queue: SlotQueue[str] = SlotQueue([2, 2])
    assert [queue.acquire(t, continuing=False) for t in "abcde"] == [0, 1, 0, 1, None]
    assert queue.release("b") == [("e", 1)]
    assert queue.release("a") == [] and queue.acquire("f", continuing=False) == 0
    assert queue.slots == 4 and sorted(queue.holders.values()) == [0, 0, 1, 1]


def test_segments_granted_are_counted_per_engine_whether_at_once_or_from_the_queue() -> None:
    queue: SlotQueue[str] = SlotQueue([1, 2])
    assert [queue.acquire(t, continuing=False) for t in "abcd"] == [1, 0, 1, None]
    assert queue.granted == [1, 2] and queue.used == [1, 2]
    assert queue.release("a") == [("d", 1)] and queue.release("b") == []  # leaving a slot counts nothing
    assert queue.release("x") == [] and queue.granted == [1, 3]  # nor does an unknown ticket
    queue.set_capacity(1, 0)
    assert queue.release("c") == [] and queue.acquire("e", continuing=True) == 0
    assert queue.granted == [2, 3] and queue.used == [1, 1]  # cumulative: the count outlives the holders


def test_an_engine_that_goes_down_takes_no_more_segments() -> None:
    queue: SlotQueue[str] = SlotQueue([1, 1])
    assert queue.acquire("a", False) == 0 and queue.acquire("b", False) == 1
    assert queue.set_capacity(1, 0) == []
    assert queue.release("b") == [] and queue.acquire("c", False) is None
    assert queue.release("a") == [("c", 0)]
    assert queue.set_capacity(1, 1) == [] and queue.acquire("d", False) == 1


def test_a_moving_segment_avoids_the_engine_it_left() -> None:
    """A segment whose engine died under it asks for any other engine: the dead one may still have room here for a
    moment (its worker sees the connection drop before the coordinator does). Tickets behind it may take that room."""
    queue: SlotQueue[str] = SlotQueue([1, 2])
    assert queue.acquire("a", False) == 1  # the most room
    assert queue.release("a") == []  # engine 1 died under it; nobody here knows yet
    assert queue.acquire("a'", True, avoid=1) == 0  # not engine 1, though it has the most room
    assert queue.acquire("b", True, avoid=0) == 1
    assert queue.acquire("c", True, avoid=1) is None  # only engine 1 has room: c waits for another...
    assert queue.acquire("d", False) == 1 and queue.waiting == ["c"]  # ...and a newcomer takes that room
    assert queue.release("a'") == [("c", 0)]
    assert queue.release("c") == [] and queue.acquire("e", False) == 0  # what c avoided leaves with it


def test_client_limits_bound_seats_and_their_rate() -> None:
    from wsserver.admission import ClientLimits

    limits = ClientLimits(max_seats=2, per_second=1.0)  # bursts of two, then one a second
    assert limits.take("a", 0.0) is None and limits.take("a", 0.0) is None
    assert limits.take("a", 0.0) == "client_full"
    assert limits.take("b", 0.0) is None  # another client has its own
    limits.free("a")
    assert limits.take("a", 0.0) == "client_rate"  # a seat came back, but the burst is spent
    assert limits.take("a", 1.0) is None
    off = ClientLimits(0, 0.0)
    assert all(off.take("a", 0.0) is None for _ in range(100))


def test_spares_are_held_only_while_nobody_waits_and_half_the_slots_are_free() -> None:
    queue: SlotQueue[str] = SlotQueue([2, 2])
    assert queue.spare("s1") == 0 and queue.spare("s2") == 1  # the roomiest engine, as a segment would get
    assert queue.spare("s3") is None  # a third would leave fewer than half the slots free
    assert queue.generating == [0, 0] and queue.used == [1, 1] and queue.granted == [0, 0]
    queue.claim("s1")  # a front end started a segment on its spare
    assert queue.generating == [1, 0] and queue.granted == [1, 0] and queue.spares == {"s2": 1}
    assert [queue.acquire(t, continuing=False) for t in "ab"] == [0, 1] and queue.acquire("c", False) is None
    assert queue.spare("s3") is None  # somebody waits
    assert queue.release("s2") == [("c", 1)]  # a spare called back goes to the queue
    assert queue.spares == {} and queue.generating == queue.used == [2, 2]
    assert queue.granted == [2, 2]  # a spare released unclaimed was never a segment


def test_an_unknown_or_claimed_spare_claims_nothing_more() -> None:
    queue: SlotQueue[str] = SlotQueue([4])
    assert queue.spare("s") == 0
    queue.claim("s")
    queue.claim("s")
    queue.claim("x")
    assert queue.granted == [1] and queue.generating == [1]
