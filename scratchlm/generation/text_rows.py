"""The text side of generation: the prompt as the model starts from it (`encode_prompt`), each
sample's continuation as its ids grow (`TextRow`: its text, cut at a stop string, and why it
ended), the printable pieces of a growing text (`IncrementalText`: nothing that a later token
could still change), and what the text-level calls hand back (`GenerationResult`, `TokenStep`,
`TokenSteps`)."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from scratchlm.errors import UserError


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

    @classmethod
    def finished(cls, tokenizer, eos_id: int | None, stops: Sequence[str], ids: list[int]) -> TextRow:
        """The finished row of a continuation known whole (a beam): `ids` pushed, then finish()."""
        row = cls(tokenizer, eos_id, stops)
        for token in ids:
            row.push(token)
        row.finish()
        return row


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


def encode_prompt(config, tokenizer, prompt: str | Sequence[int]) -> tuple[list[int], list[int], bool]:
    """(prompt ids as encoded, the ids a model of `config` starts from, whether they were cropped):
    an empty prompt starts from BOS, one longer than the context keeps its last block_size ids
    (with a warning that names the caller's line). A prompt given as ids (a chat template's) is
    taken as it is."""
    if prompt is None or isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt)) if prompt else []
    else:
        ids = [int(i) for i in prompt]
    if not ids:
        bos = getattr(tokenizer, "bos_id", None)
        if bos is None:
            raise UserError("the prompt is empty and the tokenizer has no BOS token; give a prompt")
        ids = [bos]
    V = config.vocab_size
    bad = sorted({i for i in ids if not 0 <= i < V})
    if bad:
        raise UserError(
            f"the tokenizer produced ids {bad[:5]} outside the model's vocabulary (vocab_size={V}); "
            "use the tokenizer the model was trained with"
        )
    block = config.block_size
    cropped = len(ids) > block
    if cropped:
        warnings.warn(
            f"the prompt has {len(ids)} tokens but the model's context is {block}; "
            f"only its last {block} tokens are used",
            stacklevel=_callers_level(),
        )
    return ids, ids[-block:] if cropped else ids, cropped


def _callers_level() -> int:
    """The stacklevel, for a warning made by the function calling this one, of the first frame
    outside scratchlm/generation: the line of whoever called the generation functions, however
    many of them lie between."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame, level = frame.f_back, level + 1
    return level


@dataclass
class GenerationResult:
    """What `generate` returns. `text` and `ids` are the first sample's continuation (the prompt
    is not repeated; an end-of-text token or stop string is not included)."""

    text: str
    ids: list[int]
    texts: list[str] = field(default_factory=list)  # every sample, in order
    all_ids: list[list[int]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)  # "length" | "eos" | "stop" per sample
    prompt_ids: list[int] = field(default_factory=list)  # as encoded, before any cropping
    prompt_cropped: bool = False  # the prompt was longer than the context; the model saw its tail
    logprobs: list[float] | None = None  # beam search: each sample's log-probability

    @classmethod
    def of_rows(cls, rows: list[TextRow], prompt_ids: list[int], cropped: bool,
                logprobs: list[float] | None = None) -> GenerationResult:
        texts = [row.text for row in rows]
        all_ids = [row.ids for row in rows]
        return cls(text=texts[0], ids=all_ids[0], texts=texts, all_ids=all_ids,
                   finish_reasons=[row.reason for row in rows], prompt_ids=prompt_ids, prompt_cropped=cropped,
                   logprobs=logprobs)


@dataclass
class TokenStep:
    """One step of `stream_tokens`: the token chosen, the text it made printable, and the scores."""

    id: int | None  # None for the last item, which only flushes text held back (see stream_tokens)
    text: str  # printable text released at this step: "" while a character is incomplete
    logits: torch.Tensor | None  # (V,) the model's raw scores this token was chosen from
    reason: str | None = None  # why the continuation ended, on the step that ended it: "eos" | "stop" | "length"


class TokenSteps(Iterator[TokenStep]):
    """What `stream_tokens` returns: iterate it for the steps. prompt_ids (the prompt as encoded),
    start_ids (the ids the model starts from: BOS for an empty prompt, the last block_size when
    cropped) and cropped are known before the first step."""

    def __init__(self, steps: Iterator[TokenStep], prompt_ids: list[int], cropped: bool, start_ids: list[int]):
        self._steps, self.prompt_ids, self.cropped, self.start_ids = steps, prompt_ids, cropped, start_ids

    def __next__(self) -> TokenStep:
        return next(self._steps)

    def close(self) -> None:
        """Stop early: the model goes back to the mode it was in."""
        self._steps.close()


def token_steps(rows: Iterator[tuple[list[TextRow], torch.Tensor | None, torch.Tensor | None]],
                printer: IncrementalText) -> Iterator[TokenStep]:
    """The steps of one row's continuation (see engine.sample_rows), each with the text it made
    printable."""
    for (row,), next_ids, logits in rows:
        piece = printer.piece(row.text, final=row.reason is not None)
        if next_ids is None:
            yield TokenStep(None, piece, None, row.reason)
        else:
            yield TokenStep(int(next_ids[0]), piece, logits[0], row.reason)
