"""Is it verse? Form and rhyme of classical Chinese poems, counted in generated text or a corpus.

A verse line is a line holding clause punctuation (，。？！；); its clauses are the runs between
those marks. A line is *in form* when every clause is 5 or 7 Han characters and nothing else
(五言 or 七言). A *quatrain* (绝句) is a poem of two verse lines of two clauses each, all in form;
it *rhymes* when its 2nd and 4th clauses end in the same rhyme group. Rhyme groups are the
thirteen of modern verse (十三辙), taken from each character's final in Mandarin (pypinyin):
Tang rhyme was Middle Chinese, so the corpus itself rhymes by this measure less often than its
poets meant, and generated poems are compared with the corpus's own rate, never with 100%.

A poem is a run of verse lines; any other line (a title, a blank line) ends it. Only whole
lines count: a text that stops mid-line has its last line left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

CLAUSE_MARKS = "，。？！；"
_CLAUSE_SPLIT = re.compile(f"[{CLAUSE_MARKS}]")
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]+")
"""A run of Han characters (the CJK ideograph blocks)."""

_GROUPS = {
    "a": "a", "ia": "a", "ua": "a",
    "o": "o", "uo": "o", "e": "o",
    "ie": "ie", "ve": "ie", "ue": "ie",
    "i": "i", "v": "i", "er": "i",
    "u": "u",
    "ai": "ai", "uai": "ai",
    "ei": "ei", "ui": "ei", "uei": "ei",
    "ao": "ao", "iao": "ao",
    "ou": "ou", "iu": "ou", "iou": "ou",
    "an": "an", "ian": "an", "uan": "an", "van": "an",
    "en": "en", "in": "en", "un": "en", "uen": "en", "vn": "en",
    "ang": "ang", "iang": "ang", "uang": "ang",
    "eng": "eng", "ing": "eng", "ong": "eng", "iong": "eng", "ueng": "eng",
}
"""Mandarin finals (pypinyin's FINALS style, ü written v) to the thirteen rhyme groups."""


@dataclass
class VerseCounts:
    verse_lines: int = 0
    in_form: int = 0
    quatrains: int = 0
    rhymed: int = 0

    @property
    def form_rate(self) -> float:
        return self.in_form / self.verse_lines if self.verse_lines else 0.0

    @property
    def rhyme_rate(self) -> float:
        return self.rhymed / self.quatrains if self.quatrains else 0.0

    def add(self, other: "VerseCounts") -> "VerseCounts":
        return VerseCounts(self.verse_lines + other.verse_lines, self.in_form + other.in_form,
                           self.quatrains + other.quatrains, self.rhymed + other.rhymed)


def clauses(line: str) -> list[str]:
    """The clauses of a verse line, without their marks (a trailing empty one dropped)."""
    parts = _CLAUSE_SPLIT.split(line.strip())
    return parts[:-1] if parts and parts[-1] == "" else parts


def is_verse_line(line: str) -> bool:
    return any(mark in line for mark in CLAUSE_MARKS)


def in_form(line: str) -> bool:
    """Every clause 5 or 7 Han characters, nothing else in it."""
    parts = clauses(line)
    return bool(parts) and all(len(p) in (5, 7) and HAN.fullmatch(p) is not None for p in parts)


def rhyme_group(char: str) -> str | None:
    """The rhyme group of a Han character's Mandarin final (its most common reading), or None."""
    from pypinyin import Style, pinyin

    final = pinyin(char, style=Style.FINALS, strict=True, errors=lambda _: [""])[0][0]
    return _GROUPS.get(final.replace("ü", "v"))


def count(text: str) -> VerseCounts:
    """Verse lines and those in form; quatrains and those that rhyme, in `text`."""
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]  # a line the text stopped in the middle of
    counts = VerseCounts()
    for poem in _poems(lines):
        counts.verse_lines += len(poem)
        counts.in_form += sum(in_form(line) for line in poem)
        parts = [clauses(line) for line in poem]
        if len(poem) == 2 and all(len(p) == 2 for p in parts) and all(in_form(line) for line in poem):
            counts.quatrains += 1
            second, fourth = rhyme_group(parts[0][1][-1]), rhyme_group(parts[1][1][-1])
            counts.rhymed += second is not None and second == fourth
    return counts


def count_all(texts: Iterable[str]) -> VerseCounts:
    total = VerseCounts()
    for text in texts:
        total = total.add(count(text if text.endswith("\n") else text + "\n"))
    return total


def _poems(lines: list[str]) -> list[list[str]]:
    poems: list[list[str]] = [[]]
    for line in lines:
        if is_verse_line(line):
            poems[-1].append(line.strip())
        elif poems[-1]:
            poems.append([])
    return [p for p in poems if p]
