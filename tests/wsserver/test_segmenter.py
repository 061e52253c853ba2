from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.wsserver.strategies import texts
from wsserver.messages import BufferingSettings
from wsserver.segmenter import Segmenter


def feed(segmenter: Segmenter, text: str, now: float = 0.0) -> list[str]:
    """Push `text` one character at a time, pulling segments as they become ready."""
    out = []
    for char in text:
        segmenter.push(char, now)
        while (segment := segmenter.next_segment(now)) is not None:
            out.append(segment.text)
    return out


def test_first_segment_at_the_first_clause_after_first_min_chars() -> None:
    seg = Segmenter(BufferingSettings(first_min_chars=10))
    assert feed(seg, "Hi, there friend, how are you") == ["Hi, there friend, "]


def test_later_segments_end_at_sentence_ends_and_keep_every_character() -> None:
    seg = Segmenter(BufferingSettings(first_min_chars=5))
    text = "Well, it is 3.5 km. Dr. Smith, e.g. the other one, said so! And then?  Next"
    out = feed(seg, text)
    assert out == ["Well, ", "it is 3.5 km. ", "Dr. Smith, e.g. the other one, said so! ", "And then? "]
    seg.flush()
    assert seg.next_segment(0.0).text == " Next"
    assert "".join(out) + " Next" == text


def test_pending_text_waits_while_a_segment_is_in_flight_then_goes_out_together() -> None:
    seg = Segmenter(BufferingSettings(first_min_chars=5))
    seg.push("First one. Second one. Third one. Fourth", 0.0)
    assert seg.next_segment(0.0).text == "First one. "
    assert seg.next_segment(0.0).text == "Second one. Third one. "


def test_max_wait_releases_whole_words_first_and_sentence_ends_later() -> None:
    seg = Segmenter(BufferingSettings(first_min_chars=50, max_wait_ms=200))
    seg.push("Hello wor", 0.0)
    assert seg.next_segment(0.1) is None and seg.deadline() == 0.2
    assert seg.next_segment(0.2).text == "Hello "
    seg.push("ld. More to come.", 0.3)
    assert seg.next_segment(0.3).text == "world. "
    assert seg.next_segment(0.3) is None  # "." at the very end is not confirmed yet
    assert seg.deadline() == 0.5
    assert seg.next_segment(0.5).text == "More to come."


def test_long_text_splits_at_the_best_boundary_within_max_segment_chars() -> None:
    seg = Segmenter(BufferingSettings(first_min_chars=1000, max_segment_chars=30))
    seg.push("one two three, four five six seven eight nine ten", 0.0)
    assert seg.next_segment(0.0).text == "one two three, "
    seg.push(" " + "x" * 40, 0.0)
    assert seg.next_segment(0.0).text == "four five six seven eight "


def test_manual_mode_only_on_flush_and_cjk() -> None:
    seg = Segmenter(BufferingSettings(mode="manual"))
    seg.push("你好，世界。今天天气很好。", 0.0)
    assert seg.next_segment(10.0) is None and seg.deadline() is None
    seg.flush()
    assert seg.next_segment(0.0).text == "你好，世界。今天天气很好。"
    auto = Segmenter(BufferingSettings(first_min_chars=3))
    assert feed(auto, "你好，世界。今天") == ["你好，", "世界。"]  # CJK punctuation needs no space after it


def test_a_first_word_still_growing_sets_no_deadline() -> None:
    """Found by the fuzzer: "Hello" with no space after it kept its max_wait_ms deadline once that passed, though
    only more text can release it, so the server's timer fired again and again (a busy event loop) until more text
    came."""
    seg = Segmenter(BufferingSettings(max_wait_ms=300))
    seg.push("Hello", 0.0)
    assert seg.deadline() is None and seg.next_segment(10.0) is None
    seg.push(" wor", 10.0)
    assert seg.deadline() == 0.3  # counted from the first character: the whole word goes out when asked
    assert [s.text for s in iter(lambda: seg.next_segment(10.0), None)] == ["Hello "]


def test_leading_whitespace_ends_no_word() -> None:
    """A first segment cut at leading whitespace was blank: skipped, it spent the first-segment rules, and the rest of
    the text waited for a sentence end instead of the first clause."""
    seg = Segmenter(BufferingSettings(max_wait_ms=300, first_min_chars=10))
    seg.push(" Hello", 0.0)
    assert seg.deadline() is None and seg.next_segment(1.0) is None
    seg.push(", how are you today", 1.0)
    assert seg.next_segment(1.0).text == " Hello, how are you "


# -- properties (hypothesis) ---------------------------------------------------------------------------------------

buffering_settings = st.builds(
    BufferingSettings,
    mode=st.sampled_from(("auto", "manual")),
    first_min_chars=st.integers(1, 60),
    max_wait_ms=st.sampled_from((0, 1, 300, 2000)),
    max_segment_chars=st.integers(20, 120),
)


@given(
    settings=buffering_settings,
    arrivals=st.lists(st.tuples(texts, st.sampled_from((0.0, 0.001, 0.1, 0.3, 1.0, 5.0)), st.booleans()), max_size=20),
)
def test_segments_keep_every_character_in_order_within_the_limit_and_no_deadline_stays_due(
    settings: BufferingSettings, arrivals: list[tuple[str, float, bool]]
) -> None:
    seg, now, segments = Segmenter(settings), 0.0, []

    def pull() -> None:
        while (segment := seg.next_segment(now)) is not None:
            segments.append(segment)

    for text, pause, flush in arrivals:
        now += pause
        seg.push(text, now)
        if flush:
            seg.flush()
        pull()
        # A deadline is when asking again may give a segment; one that has passed would have given it just now.
        deadline = seg.deadline()
        assert deadline is None or deadline > now
    seg.flush()
    pull()
    assert not seg.pending and seg.deadline() is None
    assert "".join(s.text for s in segments) == "".join(text for text, _, _ in arrivals)
    assert all(0 < len(s.text) <= settings.max_segment_chars for s in segments)
    assert [s.start for s in segments] == [0, *(s.end for s in segments)][: len(segments)]
