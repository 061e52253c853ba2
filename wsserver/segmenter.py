"""Incremental text -> segments, the pieces of a context's text that go to the engine one at a time.

Pull model: text is pushed as it arrives, and the context asks for `next_segment()` only when the engine is free for
it (the previous segment has finished generating). Text that piles up meanwhile goes out together, so later
segments hold whole sentences instead of whatever arrived first. Time is an input (`now`, in seconds) and
`deadline()` says when asking again may give a different answer without new text.

Rules (`auto`): the first segment ends at the first clause or sentence boundary at or after `first_min_chars`, or,
once `max_wait_ms` passed since its first character, at the last whole word. Later segments end at the last
sentence boundary within `max_segment_chars`; a sentence end at the very end of the buffer counts once
`max_wait_ms` passed without more text. `manual`: only `flush()` releases text. Either way, a piece longer than
`max_segment_chars` is split at a sentence, clause or word boundary, in that order of preference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from wsserver.messages import BufferingSettings

# A boundary is confirmed by what follows it: whitespace after Latin punctuation (so "3.5" and "e.g.x" are not
# boundaries), nothing for CJK punctuation, which is written without spaces. Closing quotes and brackets stay with
# the sentence they close.
_CLOSERS = "\"'”’»)\\]」』）"
_SENTENCE = re.compile(rf"[.!?…]+[{_CLOSERS}]*\s+|[。！？]+[{_CLOSERS}]*\s*|\n\s*")
_CLAUSE = re.compile(rf"[,;:—–][{_CLOSERS}]*\s+|[，、；：]\s*")
_SENTENCE_AT_END = re.compile(rf"[.!?…。！？][{_CLOSERS}]*$")
_WORD = re.compile(r"\s+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
# A full stop after these is not the end of a sentence.
_ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "st",
        "jr",
        "sr",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "approx",
        "no",
        "fig",
        "inc",
        "ltd",
        "co",
        "corp",
        "dept",
        "est",
        "mt",
        "ave",
        "u.s",
        "a.m",
        "p.m",
    ]
)
_LAST_WORD = re.compile(r"(\S+)\.$")


@dataclass(frozen=True, slots=True)
class Segment:
    text: str  # exactly as received, trailing whitespace included
    start: int  # offset of its first character in the context's text
    end: int  # offset one past its last character

    @property
    def is_blank(self) -> bool:
        return not self.text.strip()


class Segmenter:
    def __init__(self, settings: BufferingSettings) -> None:
        self.settings = settings
        self._buffer = ""  # received, not yet segmented
        self._start = 0  # offset of _buffer[0] in the context's text
        self._flush_to = 0  # text before this offset must go out without waiting for a boundary
        self._emitted = False  # the first segment is out (the early-first-segment rule applies only before)
        self._first_at: float | None = None  # when the buffer's oldest unsegmented text arrived
        self._last_at: float | None = None  # when text last arrived

    @property
    def received(self) -> int:
        """Characters received so far."""
        return self._start + len(self._buffer)

    @property
    def pending(self) -> bool:
        return bool(self._buffer)

    def push(self, text: str, now: float) -> None:
        if not text:
            return
        if not self._buffer:
            self._first_at = now
        self._buffer += text
        self._last_at = now

    def flush(self) -> None:
        self._flush_to = self.received

    def deadline(self) -> float | None:
        if not self._buffer or self.settings.mode == "manual" or self._flush_to > self._start:
            return None
        wait = self.settings.max_wait_ms / 1000
        if not self._emitted:
            assert self._first_at is not None
            # Time releases a first segment only up to a whole word: until one has arrived, only text can. (A
            # deadline kept in the past would have the caller's timer fire again and again.)
            return None if _last_word_end(self._buffer) is None else self._first_at + wait
        if _SENTENCE_AT_END.search(self._buffer):
            assert self._last_at is not None
            return self._last_at + wait
        return None

    def next_segment(self, now: float) -> Segment | None:
        cut = self._cut(now)
        if cut is None:
            return None
        segment = Segment(self._buffer[:cut], self._start, self._start + cut)
        self._buffer = self._buffer[cut:]
        self._start += cut
        self._emitted = True
        self._first_at = now if self._buffer else None
        return segment

    def _cut(self, now: float) -> int | None:
        """Length of the next segment, or None while it is not ready."""
        buf, limit = self._buffer, self.settings.max_segment_chars
        if not buf:
            return None
        forced = self._flush_to - self._start
        if forced > 0:
            return forced if forced <= limit else _best_cut(buf, limit)
        if self.settings.mode == "manual":
            return None
        if len(buf) > limit:
            return _best_cut(buf, limit)
        deadline = self.deadline()
        expired = deadline is not None and now >= deadline
        if not self._emitted:
            for match in _boundaries(buf, _SENTENCE, _CLAUSE):
                if match >= self.settings.first_min_chars:
                    return match
            return _last_word_end(buf) if expired else None
        ends = _boundaries(buf, _SENTENCE)
        if ends:
            return ends[-1]
        return len(buf) if expired else None


def _boundaries(text: str, *patterns: re.Pattern[str]) -> list[int]:
    """Sorted offsets just after each confirmed boundary of the given kinds."""
    ends = set()
    for pattern in patterns:
        for match in pattern.finditer(text):
            if pattern is _SENTENCE and _is_abbreviation(text[: match.start() + 1]):
                continue
            ends.add(match.end())
    return sorted(ends)


def _is_abbreviation(text: str) -> bool:
    """Does `text` end with a full stop that belongs to an abbreviation or an initial ("Dr.", "J.")?"""
    match = _LAST_WORD.search(text)
    if match is None:
        return False
    word = match.group(1)
    return word.lower().rstrip(".") in _ABBREVIATIONS or (len(word) == 1 and word.isupper())


def _best_cut(text: str, limit: int) -> int:
    """Where to split a piece longer than `limit`: the last sentence, clause or word end within it, or at `limit`."""
    head = text[: limit + 1]  # a boundary may end with the whitespace just past the limit
    for patterns in ((_SENTENCE,), (_CLAUSE,), (_WORD,)):
        ends = [end for end in _boundaries(head, *patterns) if end <= limit]
        if ends:
            return ends[-1]
    return limit


def _last_word_end(text: str) -> int | None:
    """Offset after the last whole word (words end at whitespace; every CJK character is a word). Whitespace at the
    start ends no word: cutting there would make a blank segment, and the first-segment rules would be spent on it."""
    ends = [m.end() for m in _WORD.finditer(text) if m.start() > 0] + [m.end() for m in _CJK.finditer(text)]
    return max(ends, default=None)
