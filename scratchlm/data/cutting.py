"""Where a long text may be cut so that its pieces, encoded one by one, give exactly the ids of
the whole text encoded at once.

A byte-level BPE (GPT-2's, and the `bpe` tokenizer scratchlm trains) first splits text into
pre-tokens with one regular expression, then merges bytes only inside a pre-token. So a cut is
safe where the expression always ends one pre-token and starts the next, whatever text is on
either side further away. With GPT-2's expression

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

three kinds of place are safe (X and Y stand for characters that are not white space):

    X\\n|Y    after a newline that has X before it and Y after it: no pre-token joins a newline
             with a letter, digit or mark, and at the end of a piece the newline is one
             pre-token just as it is in the whole text
    X| Y     before a single space between X and Y: the space always goes with what follows
    L|P      between a letter or digit L and a mark P (anything neither white space, letter nor
             digit): a run of letters or digits ends there, and marks never take one in

Whitespace before a newline is not safe: at the end of a piece "\\r\\n" is one pre-token, while in
the whole text, before a letter, it is two. Nor is any place inside a run of white space, or
inside a run of letters (unpunctuated Chinese, say, is one pre-token per line). Classical and
modern Chinese alike have marks (，。) or newlines often enough; a piece that finds no safe place
within MAX_PIECE_CHARS is cut there anyway, and that forced cut is counted (meta.json) because
the ids around it may differ from a one-shot encode.

"White space" on either side of a cut is taken in the widest sense any of the engines uses
(Unicode's White_Space, Python's str.isspace, which adds U+001C..U+001F), so an engine whose
`\\s` is narrower still sees the same boundaries. The char tokenizer maps one character to one
id, so any place is safe for it.
"""
from __future__ import annotations

import regex

from scratchlm.data.config import CHUNK_CHARS, MAX_PIECE_CHARS

RULES = ("anywhere", "gpt2")
"""`anywhere`: one character, one id (char). `gpt2`: GPT-2's pre-tokenizer (gpt2, bpe)."""

_NOT_SPACE = r"[^\p{White_Space}\x1c-\x1f]"
_SAFE = regex.compile(
    rf"(?<={_NOT_SPACE})\n(?={_NOT_SPACE})"  # the cut goes after this newline
    rf"|(?<={_NOT_SPACE})(?= {_NOT_SPACE})"  # ... before this space
    rf"|(?<=[\p{{L}}\p{{N}}])(?=[^\p{{White_Space}}\x1c-\x1f\p{{L}}\p{{N}}])"  # ... between a letter and a mark
)


def find_cut(text: str, start: int, rule: str | None) -> int:
    """The first safe place to cut `text` at or after `start` (0 < place < len(text)), or -1."""
    if start >= len(text):
        return -1
    start = max(start, 1)
    if rule == "anywhere":
        return start
    if rule != "gpt2":
        return -1
    m = _SAFE.search(text, start - 1)
    while m is not None:
        cut = m.end() if m.group() == "\n" else m.start()
        if start <= cut < len(text):
            return cut
        m = _SAFE.search(text, m.start() + 1)
    return -1


class Cutter:
    """Cuts pieces of about `target` characters off the front of a growing text.

    rule None (a tokenizer whose pre-tokenization is not known here) never cuts: each document
    is encoded whole. `forced` counts the cuts made at max_chars for want of a safe place."""

    def __init__(self, rule: str | None, target: int | None = None, max_chars: int | None = None):
        if rule is not None and rule not in RULES:
            raise ValueError(f"cut rule {rule!r} is not one of {', '.join(RULES)} or None")
        self.rule, self.target = rule, target or CHUNK_CHARS
        self.max_chars = max(self.target, max_chars or MAX_PIECE_CHARS)
        self.forced = 0

    def pieces(self, text: str, final: bool) -> tuple[list[str], str]:
        """(the pieces cut off the front of text, the rest). With final=False the rest is kept
        for more text to come (a cut needs to see the character after it); with final=True the
        rest is the document's last piece."""
        pieces: list[str] = []
        start = 0
        while self.rule is not None and len(text) - start > self.target:
            cut = find_cut(text, start + self.target, self.rule)
            if cut == -1 or cut - start > self.max_chars:
                if len(text) - start <= self.max_chars:
                    break  # more text may bring a safe place (or the end)
                cut = find_cut(text, start + 1, self.rule)  # a shorter piece, if there is a safe place at all
                if cut == -1 or cut - start > self.max_chars:
                    cut = start + self.max_chars
                    self.forced += 1
            pieces.append(text[start:cut])
            start = cut
        rest = text[start:]
        if final and rest:
            pieces.append(rest)
            rest = ""
        return pieces, rest


def split_for_encoding(text: str, target: int | None = None, rule: str | None = "gpt2") -> list[str]:
    """A whole text in pieces of about `target` characters (None: CHUNK_CHARS) whose ids, encoded one by one and
    joined, are the ids of the whole text (see the module's docstring)."""
    pieces, _ = Cutter(rule, target).pieces(text, final=True)
    return pieces or [text]
