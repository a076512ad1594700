"""The text side of generation: each sample's continuation as its ids grow (`TextRow`: its text,
cut at a stop string, and why it ended), and the printable pieces of a growing text
(`IncrementalText`: nothing that a later token could still change)."""

from __future__ import annotations

from collections.abc import Sequence


def _ends_inside(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that could still grow into one of `stops`."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if s.startswith(text[-k:]):
                longest = k
                break
    return longest


class TextRow:
    """One sample's continuation as it grows: its ids, its text, and whether and why it ended.
    The text holds no special tokens (a <|bos|> the model chose is in `ids`, not in `text`)."""

    def __init__(self, tokenizer, eos_id: int | None, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        # left out of the text, as an exported model's decode(skip_special_tokens=True) leaves them out
        self.special_ids = frozenset(getattr(tokenizer, "special_ids", ()))
        self.stops = list(stops)
        self.ids: list[int] = []
        self.reason: str | None = None  # None while running
        self._text: str | None = ""  # cached decode of self.ids; None when stale
        self._cut: int | None = None  # where a stop string begins

    def push(self, token: int) -> None:
        if self.reason is not None:
            return
        if self.eos_id is not None and token == self.eos_id:
            self.reason = "eos"
            return
        self.ids.append(token)
        self._text = None
        if self.stops:
            text = self.text
            hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
            if hits:
                # the text ends before the stop string; the ids keep the token that completed it
                self._cut = min(hits)
                self.reason = "stop"

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.tokenizer.decode([i for i in self.ids if i not in self.special_ids])
        return self._text if self._cut is None else self._text[: self._cut]

    def finish(self) -> None:
        if self.reason is None:
            self.reason = "length"


class IncrementalText:
    """Turns a growing list of token ids into printable pieces.

    Each call decodes the whole list and hands back only the new part that can no longer change:
    a trailing U+FFFD (bytes of a multi-byte character still to come) is held back, and so is a
    tail that may be the start of a stop string. `flush` hands back whatever is left.
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self.emitted = 0  # characters already handed out

    def piece(self, text: str, final: bool = False) -> str:
        stable = len(text)
        if not final:
            stable = len(text.rstrip("\ufffd"))
            stable -= _ends_inside(text[:stable], self.stops)
        if stable <= self.emitted:
            return ""
        out = text[self.emitted : stable]
        self.emitted = stable
        return out
