"""Text normalisation: make a segment sayable before it reaches the model.

Runs on whole segments, never on token deltas (a number or a markdown marker split across two deltas would be
mangled). Language-neutral cleanup (markdown, emoji, typographic quotes) applies to everything; the English rules
(numbers, currencies, times, percentages, ordinals, abbreviations) apply only when the segment has no CJK
characters, since the models read CJK numerals and mixed-script numbers themselves.
"""

from __future__ import annotations

import re

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
}
_ABBREVIATIONS = {
    "Mr.": "Mister",
    "Mrs.": "Missus",
    "Ms.": "Miz",
    "Dr.": "Doctor",
    "Prof.": "Professor",
    "St.": "Saint",
    "Jr.": "Junior",
    "Sr.": "Senior",
    "vs.": "versus",
    "e.g.": "for example",
    "i.e.": "that is",
    "etc.": "et cetera",
    "approx.": "approximately",
    "No.": "number",
}
_SYMBOLS = {"&": " and ", "@": " at ", "…": "...", "“": '"', "”": '"', "‘": "'", "’": "'", "\u00a0": " "}

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_EMOJI = re.compile("[\U0001f000-\U0001faff\u2600-\u27bf\ufe0f\u200d]")
_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_MD_MARKS = re.compile(r"(\*\*|__|`+|(?<!\w)[*_](?=\S)|(?<=\S)[*_](?!\w))")
_MD_LINE = re.compile(r"^[ \t]*(?:#{1,6}[ \t]+|[-*+][ \t]+|>[ \t]*)", re.MULTILINE)
_ABBREVIATION = re.compile(r"(?<!\w)(" + "|".join(re.escape(a) for a in _ABBREVIATIONS) + r")(?=\s|$)")
_MONEY = re.compile(
    r"([$€£])\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?(?:\s?(thousand|million|billion|[kKmMbB]n?)\b)?"
)
_TIME = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)(?:\s?([aApP])\.?[mM]\b)?(?!\d)")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s?%")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b")
_YEAR = re.compile(r"(?<![\d.,$€£])(1[1-9]\d\d|20\d\d)(?![\d,%]|\.\d)")
_DECIMAL = re.compile(r"(?<![\d.])(\d+)\.(\d+)(?!\d|\.\d)")
_INTEGER = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+|\d+)(?![\d.]*\d)")
_NEGATIVE = re.compile(r"(?<![\w.])-(?=\d)")
_SPACES = re.compile(r"[ \t]+")
_SCALE_WORDS = {"k": "thousand", "m": "million", "mn": "million", "b": "billion", "bn": "billion"}


def normalize(text: str) -> str:
    """The text the model should read; empty when nothing in `text` is sayable."""
    for symbol, spoken in _SYMBOLS.items():
        text = text.replace(symbol, spoken)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_LINE.sub("", text)
    text = _MD_MARKS.sub("", text)
    text = _EMOJI.sub("", text)
    if not _CJK.search(text):
        text = _english(text)
    return _SPACES.sub(" ", text).strip()


def _english(text: str) -> str:
    text = _ABBREVIATION.sub(lambda m: _ABBREVIATIONS[m.group(1)], text)
    text = _NEGATIVE.sub("minus ", text)
    text = _MONEY.sub(_money, text)
    text = _TIME.sub(_time, text)
    text = _PERCENT.sub(lambda m: f"{_decimal_words(m.group(1))} percent", text)
    text = _ORDINAL.sub(lambda m: ordinal_words(int(m.group(1))), text)
    text = _YEAR.sub(lambda m: year_words(int(m.group(1))), text)
    text = _DECIMAL.sub(lambda m: _decimal_words(m.group(0)), text)
    return _INTEGER.sub(lambda m: _integer_words(m.group(0)), text)


def number_words(n: int) -> str:
    """Cardinal number in English words: 1234 -> "one thousand two hundred thirty four"."""
    if n < 0:
        return "minus " + number_words(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (" " + _ONES[ones] if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return _ONES[hundreds] + " hundred" + (" " + number_words(rest) if rest else "")
    for value, name in _SCALES:
        if n >= value:
            high, rest = divmod(n, value)
            return number_words(high) + " " + name + (" " + number_words(rest) if rest else "")
    raise AssertionError("unreachable")


def ordinal_words(n: int) -> str:
    words = number_words(n).split()
    last = words[-1]
    if last in _ORDINAL_WORDS:
        words[-1] = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def year_words(year: int) -> str:
    """Read a year: 1990 -> "nineteen ninety", 2005 -> "two thousand five", 1900 -> "nineteen hundred"."""
    high, low = divmod(year, 100)
    if 2000 <= year < 2010:
        return number_words(year)
    if low == 0:
        return number_words(high) + " hundred"
    return number_words(high) + (" oh " if low < 10 else " ") + number_words(low)


def _integer_words(digits: str) -> str:
    value = int(digits.replace(",", ""))
    if abs(value) >= 10**15:  # an id or a phone number, not a quantity: read it digit by digit
        return " ".join(_ONES[int(d)] for d in digits if d.isdigit())
    return number_words(value)


def _decimal_words(number: str) -> str:
    whole, _, frac = number.partition(".")
    words = _integer_words(whole)
    return words + (" point " + " ".join(_ONES[int(d)] for d in frac) if frac else "")


def _money(match: re.Match[str]) -> str:
    one, many, cent, cents = _CURRENCIES[match.group(1)]
    whole, frac, scale = match.group(2), match.group(3), match.group(4)
    if scale:  # "$1.5 million" -> "one point five million dollars"
        amount = _decimal_words(whole + ("." + frac if frac else ""))
        return f"{amount} {_SCALE_WORDS.get(scale.lower(), scale.lower())} {many}"
    value = int(whole.replace(",", ""))
    words = f"{_integer_words(whole)} {one if value == 1 else many}"
    sub = int(frac.ljust(2, "0")) if frac else 0
    if sub:
        words += f" and {number_words(sub)} {cent if sub == 1 else cents}"
    return words


def _time(match: re.Match[str]) -> str:
    hour, minute, meridiem = int(match.group(1)), int(match.group(2)), match.group(3)
    if minute == 0:
        words = number_words(hour) + ("" if meridiem else " o'clock")
    else:
        words = number_words(hour) + (" oh " if minute < 10 else " ") + number_words(minute)
    return words + (f" {meridiem.upper()} M" if meridiem else "")
