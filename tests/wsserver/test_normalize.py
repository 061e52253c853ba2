from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wsserver.strategies import texts
from wsserver.normalize import normalize, number_words, ordinal_words, year_words


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("It costs $12.50.", "It costs twelve dollars and fifty cents."),
        ("£1 and €2.01", "one pound and two euros and one cent"),
        ("$1.5 million", "one point five million dollars"),
        ("Meet at 3:30pm.", "Meet at three thirty P M."),
        ("At 10:00 or 7:05", "At ten o'clock or seven oh five"),
        ("50% of 1,234 people", "fifty percent of one thousand two hundred thirty four people"),
        ("the 21st and 2nd", "the twenty first and second"),
        ("in 1990 and 2005", "in nineteen ninety and two thousand five"),
        ("Pi is 3.14 and -5.", "Pi is three point one four and minus five."),
        ("Dr. Smith vs. Mr. Jones, e.g. today", "Doctor Smith versus Mister Jones, for example today"),
        ("**Bold** _it_ `code` [link](http://x) 😀 “quoted”", 'Bold it code link "quoted"'),
        ("# Title\n- item", "Title\nitem"),
        ("价格是8034亿元。", "价格是8034亿元。"),  # CJK is left to the model
        ("snake_case stays", "snake_case stays"),
        ("🙂", ""),
    ],
)
def test_normalize(text: str, spoken: str) -> None:
    assert normalize(text) == spoken


def test_number_words() -> None:
    assert number_words(0) == "zero"
    assert number_words(1_000_001) == "one million one"
    assert number_words(-42) == "minus forty two"
    assert (
        ordinal_words(12) == "twelfth" and ordinal_words(40) == "fortieth" and ordinal_words(101) == "one hundred first"
    )
    assert year_words(1900) == "nineteen hundred" and year_words(2024) == "twenty twenty four"
    assert year_words(1905) == "nineteen oh five"


@given(text=texts | st.text())
def test_normalizing_any_text_gives_clean_text(text: str) -> None:
    spoken = normalize(text)
    assert spoken == spoken.strip() and "  " not in spoken
