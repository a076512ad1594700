"""Requests for a poem in a given form, in fixed words, and whether a reply obeys one.

Three kinds, each in exactly these words (so anyone can write new ones); a reply is the poem alone,
one couplet (two clauses) per line, as the corpus writes it (床前明月光，疑是地上霜。):

    title    写一首五言绝句，题为《秋夜》。     4 clauses (绝句) or 8 (律诗), of 5 (五言) or 7 (七言)
    heads    写一首七言绝句，藏头“春夏秋冬”。   a 绝句 whose clause i begins with the i-th head
    continue 续写：床前明月光，疑是地上霜。     the rest of the poem, every clause the given one's length

`obeys(request, reply)` checks the form only: the clause count and lengths (Han characters only),
the heads, the couplets one per line. Whether the words suit the title is not counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scratchlm.text.verse import HAN, clauses, is_verse_line

LENGTHS = {5: "五言", 7: "七言"}
SIZES = {4: "绝句", 8: "律诗"}
_TITLE = re.compile(r"写一首(五言|七言)(绝句|律诗)，题为《(.+)》。")
_HEADS = re.compile(r"写一首(五言|七言)绝句，藏头“(.{4})”。")
_CONTINUE = re.compile(r"续写：(.+)")


@dataclass(frozen=True)
class Form:
    """What a request asks for: its kind, the clause length and count, and the heads if any."""

    kind: str
    """title, heads or continue."""
    length: int
    clauses: int | None
    """4 or 8; None for continue (the poem may end after any whole couplet)."""
    heads: str = ""


def title_request(length: int, count: int, title: str) -> str:
    return f"写一首{LENGTHS[length]}{SIZES[count]}，题为《{title}》。"


def heads_request(length: int, heads: str) -> str:
    return f"写一首{LENGTHS[length]}绝句，藏头“{heads}”。"


def continue_request(first_line: str) -> str:
    return f"续写：{first_line}"


def form_of(request: str) -> Form | None:
    """The form `request` asks for, or None for words that are none of the three kinds."""
    by_name = {name: n for n, name in LENGTHS.items()}
    if m := _TITLE.fullmatch(request):
        return Form("title", by_name[m[1]], {name: n for n, name in SIZES.items()}[m[2]])
    if m := _HEADS.fullmatch(request):
        return Form("heads", by_name[m[1]], 4, m[2]) if HAN.fullmatch(m[2]) else None
    if (m := _CONTINUE.fullmatch(request)) and is_verse_line(m[1]):
        parts = clauses(m[1])
        if len(parts) == 2 and len(parts[0]) in LENGTHS and all(len(p) == len(parts[0]) and HAN.fullmatch(p) for p in parts):
            return Form("continue", len(parts[0]), None)
    return None


def obeys(request: str, reply: str) -> bool:
    """Whether `reply` is a poem in the form `request` asks for (see the module)."""
    form = form_of(request)
    lines = reply.strip("\n").split("\n")
    if form is None or not reply.strip():
        return False
    parts = [clauses(line) for line in lines]
    if not all(is_verse_line(line) and len(p) == 2 for line, p in zip(lines, parts)):
        return False  # one couplet a line
    flat = [c for p in parts for c in p]
    if not all(len(c) == form.length and HAN.fullmatch(c) for c in flat):
        return False
    if form.clauses is not None and len(flat) != form.clauses:
        return False
    return all(c.startswith(h) for c, h in zip(flat, form.heads))
