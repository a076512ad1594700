"""Tokenizers: text -> token ids -> text, behind one small interface (station 1).

Three kinds, each a class with the same attributes and methods:

- `char`: one id per distinct character of the training text (nanoGPT's shakespeare_char), plus
  the special tokens. Unknown characters at encode time are an error unless an `<unk>` id was asked for.
- `bpe`: byte-level BPE trained on the user's text with Hugging Face `tokenizers`. Byte-level means
  every UTF-8 byte has an id, so any Unicode string round-trips exactly.
- `gpt2`: GPT-2's 50257-token byte-level BPE through `tiktoken`, from a local rank file
  (`gpt2.tiktoken`) or tiktoken's own download.

Every tokenizer has `kind`, `vocab_size`, `bos_id`, `eos_id`, `special_ids`, `cut_rule`,
`encode(text)`, `encode_array(text)`, `encode_batch(texts)`, `decode(ids)`, `save(directory)`,
`token_byte_lengths()` and `for_thread()` (a copy for one of several encoding threads);
`load_tokenizer(directory)` reads any of them back. Encoding treats the text literally: a special
token's spelling inside the text ("<|endoftext|>") is encoded as ordinary characters, never as the
special id, so user data cannot inject document boundaries. Decoding writes special ids out as
their spelling; generated text leaves the `special_ids` out before decoding, which is what Hugging
Face's decode(skip_special_tokens=True) does (scratchlm.generation.text_rows).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from scratchlm.errors import UserError
# the byte-level kinds and the shared names are also this module's API
from scratchlm.text.byte_bpe import BPETokenizer, GPT2Tokenizer, byte_alphabet, own_core  # noqa: F401
from scratchlm.text.token_names import (  # noqa: F401
    BOS, CONFIG_FILE, EOS, GPT2_EOT_ID, GPT2_PATTERN, GPT2_VOCAB_SIZE, KINDS, UNK, is_special_spelling, write_json,
)


class UnknownCharactersError(UserError):
    """Text holds characters the char tokenizer's vocabulary lacks."""

    def __init__(self, characters: Sequence[str]):
        self.characters = list(characters)
        shown = ", ".join(repr(c) for c in self.characters[:20])
        more = f" and {len(self.characters) - 20} more" if len(self.characters) > 20 else ""
        super().__init__(
            f"text holds {len(self.characters)} character(s) not in the char tokenizer's vocabulary: "
            f"{shown}{more}; train the tokenizer on text that contains them, or build it with an <unk> id"
        )


# char


class CharTokenizer:
    """One id per character. Built from text, ids 0..n-1 are the sorted characters, then <|bos|>,
    <|endoftext|> and, if asked for, <unk>. Read from another program's vocabulary (`from_ids`,
    what import-hf does), the ids are that file's exactly: in any order, and with ids that no
    piece holds (nothing encodes to them; they decode to nothing, as in transformers)."""

    kind = "char"

    def __init__(self, chars: Iterable[str], *, unk: bool = False):
        chars = sorted(set(chars))
        if any(len(c) != 1 for c in chars):
            raise ValueError("char vocabulary entries must be single characters")
        n = len(chars)
        ids = {c: i for i, c in enumerate(chars)} | {BOS: n, EOS: n + 1} | ({UNK: n + 2} if unk else {})
        self._set_ids(ids, UNK if unk else None)

    @classmethod
    def from_ids(cls, ids: Mapping[str, int], unk: str | None = None) -> "CharTokenizer":
        """The vocabulary `ids` (piece -> id) as it stands: single characters, plus <|bos|> and
        <|endoftext|>, and <unk> if the file has it. `unk`: the piece unknown characters become
        (None: they are an error). UserError for anything a char tokenizer cannot hold."""
        tok = cls.__new__(cls)
        tok._set_ids(dict(ids), unk)
        return tok

    def _set_ids(self, ids: dict[str, int], unk: str | None) -> None:
        _check_char_ids(ids, unk)
        self.vocab_size = max(ids.values()) + 1
        self.bos_id, self.eos_id = ids[BOS], ids[EOS]
        self.unk_id: int | None = ids[unk] if unk is not None else None
        self._ids = dict(sorted(ids.items(), key=lambda kv: kv[1]))  # piece -> id, in id order
        self.chars = [p for p in self._ids if len(p) == 1]  # in id order (sorted, when built from text)
        self.special_ids = frozenset(i for p, i in self._ids.items() if len(p) > 1)
        self._id_to_piece = [""] * self.vocab_size
        for piece, i in self._ids.items():
            self._id_to_piece[i] = piece
        # Encoding looks code points up in this sorted array: vectorised, so megabytes take milliseconds.
        by_codepoint = sorted((ord(c), ids[c]) for c in self.chars)
        self._codepoints = np.array([cp for cp, _ in by_codepoint], dtype=np.int64)
        self._codepoint_ids = np.array([i for _, i in by_codepoint], dtype=np.int64)

    @property
    def default_layout(self) -> bool:
        """The ids are what `CharTokenizer(chars)` gives: sorted characters, then the specials."""
        return self._ids == CharTokenizer(self.chars, unk=self.unk_id is not None)._ids and (
            self.unk_id is None or self._id_to_piece[self.unk_id] == UNK)

    def piece_ids(self) -> dict[str, int]:
        """piece -> id, in id order: every character, and the special tokens by their spelling."""
        return dict(self._ids)

    @property
    def specials(self) -> dict[str, int]:
        """Each special token's spelling -> its id (<|bos|>, <|endoftext|>, <unk> if any, and
        tokens added by with_tokens)."""
        return {p: i for p, i in self._ids.items() if len(p) > 1}

    def with_tokens(self, specials: Sequence[str] = (), chars: Iterable[str] = ()) -> "CharTokenizer":
        """This vocabulary with every id kept, then each character of `chars` it lacks (in code
        point order) and each of `specials` it lacks (in the order given), at the next free ids."""
        new = sorted(set(chars) - set(self._ids)) + [t for t in dict.fromkeys(specials) if t not in self._ids]
        if not new:
            return self
        ids = self._ids | {piece: self.vocab_size + k for k, piece in enumerate(new)}
        unk = None if self.unk_id is None else self._id_to_piece[self.unk_id]
        return CharTokenizer.from_ids(ids, unk)

    @classmethod
    def train(cls, texts: Iterable[str], *, unk: bool = False) -> "CharTokenizer":
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        if not seen:
            raise UserError("the char tokenizer needs some text to collect characters from; the input is empty")
        return cls(seen, unk=unk)

    def encode_array(self, text: str) -> np.ndarray:
        """(len(text),) int64 ids."""
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        if len(self._codepoints) == 0:
            pos = np.zeros(len(cps), dtype=np.int64)
            known = np.zeros(len(cps), dtype=bool)
        else:
            pos = np.minimum(np.searchsorted(self._codepoints, cps), len(self._codepoints) - 1)
            known = self._codepoints[pos] == cps
        ids = self._codepoint_ids[pos] if len(self._codepoints) else pos
        if not known.all():
            if self.unk_id is None:
                missing = sorted({chr(c) for c in cps[~known].tolist()})
                raise UnknownCharactersError(missing)
            ids = np.where(known, ids, self.unk_id)
        return ids

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    cut_rule = "anywhere"
    """Where a text may be cut without changing its ids (scratchlm.data.cutting): anywhere."""

    def for_thread(self) -> "CharTokenizer":
        """Itself: NumPy shares nothing between threads that would slow them (see own_core)."""
        return self

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self._id_to_piece[i] for i in ids)

    def token_byte_lengths(self) -> np.ndarray:
        """(vocab_size,) UTF-8 bytes each id stands for in the text; 0 for special ids (and unused ones)."""
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for c in self.chars:
            lengths[self._ids[c]] = len(c.encode("utf-8"))
        return lengths

    def save(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.default_layout:  # the compact form every char tokenizer had before from_ids
            config = {"kind": self.kind, "chars": "".join(self.chars), "unk": self.unk_id is not None}
        else:
            config = {"kind": self.kind, "pieces": self._id_to_piece_or_none(),
                      "unk": None if self.unk_id is None else self._id_to_piece[self.unk_id]}
        write_json(directory / CONFIG_FILE, config)

    def _id_to_piece_or_none(self) -> list[str | None]:
        """Each id's piece, None for an id no piece holds."""
        pieces: list[str | None] = [None] * self.vocab_size
        for piece, i in self._ids.items():
            pieces[i] = piece
        return pieces

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def _check_char_ids(ids: dict[str, int], unk: str | None) -> None:
    """What a char vocabulary must be: single characters and the special tokens, each its own
    id >= 0, <|bos|> and <|endoftext|> among them."""
    odd = [p for p in ids if len(p) != 1 and p != UNK and not is_special_spelling(p)]
    if odd:
        raise UserError(f"piece {odd[0]!r} is neither one character, {UNK} nor a special token spelled <|name|>; "
                        "a char tokenizer cannot hold it")
    bad = [(p, i) for p, i in ids.items() if isinstance(i, bool) or not isinstance(i, int) or i < 0]
    if bad:
        raise UserError(f"piece {bad[0][0]!r} has id {bad[0][1]!r}; ids are whole numbers from 0")
    if len(set(ids.values())) != len(ids):
        i = next(i for i in ids.values() if list(ids.values()).count(i) > 1)
        raise UserError(f"id {i} is given to {[p for p, j in ids.items() if j == i]}; each id must be one piece's")
    top = max(ids.values(), default=0)
    if top >= 16 * len(ids) + 1024:  # a list of top + 1 pieces is built: keep it near the vocabulary's size
        raise UserError(f"ids run to {top} for only {len(ids)} pieces; a char vocabulary's ids are close together")
    missing = [s for s in (BOS, EOS) if s not in ids]
    if missing:
        raise UserError(f"the vocabulary lacks {' and '.join(missing)}, which scratchlm's char tokenizer needs")
    if unk is not None and unk not in ids:
        raise UserError(f"the unknown-character piece {unk!r} is not in the vocabulary")


Tokenizer = CharTokenizer | BPETokenizer | GPT2Tokenizer


# ----------------------------------------------------------------------------------------------
# construction, saving, loading


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UserError(f"unknown tokenizer {kind!r}; choose one of {', '.join(KINDS)}")


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int | None = None, *, unk: bool = False,
                    length: int | None = None) -> Tokenizer:
    """Build a tokenizer from text. `char` collects the characters, `bpe` trains to `vocab_size`
    (default 8192); `gpt2` is fixed and needs no training (use get_tokenizer)."""
    _check_kind(kind)
    if kind == "char":
        return CharTokenizer.train(texts, unk=unk)
    if kind == "bpe":
        return BPETokenizer.train(texts, vocab_size or 8192, length=length)
    raise UserError("the gpt2 tokenizer is fixed, not trained; use get_tokenizer('gpt2', tokenizer_file=...)")


def get_tokenizer(kind: str, *, tokenizer_file: str | os.PathLike | None = None) -> Tokenizer:
    """A ready-made tokenizer: `gpt2` from a rank file (offline) or tiktoken (online), or a saved
    `char`/`bpe` tokenizer from its directory (or, for bpe, a tokenizer.json file)."""
    _check_kind(kind)
    if tokenizer_file is not None and Path(tokenizer_file).is_dir():
        tok = load_tokenizer(tokenizer_file)
        if tok.kind != kind:
            raise UserError(f"{tokenizer_file}: holds a {tok.kind} tokenizer, not {kind}")
        return tok
    if kind == "gpt2":
        return GPT2Tokenizer.from_rank_file(tokenizer_file) if tokenizer_file else GPT2Tokenizer.from_tiktoken()
    if tokenizer_file is None:
        raise UserError(f"the {kind} tokenizer is trained on your text; use train_tokenizer or pass a saved tokenizer")
    if kind == "bpe":
        if not Path(tokenizer_file).is_file():
            raise UserError(f"{tokenizer_file}: no such tokenizer file")
        return BPETokenizer.from_file(tokenizer_file)
    raise UserError(f"{tokenizer_file}: a char tokenizer is loaded from a directory saved by scratchlm")


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Read back whatever `save(directory)` wrote."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        kind = config["kind"]
    except FileNotFoundError:
        raise UserError(f"{directory}: no saved tokenizer here ({CONFIG_FILE} is missing)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{config_path}: not a valid tokenizer config ({exc})") from None
    if kind == "char":
        return _load_char(config, config_path)
    if kind == "bpe":
        return BPETokenizer.from_file(directory / config.get("file", "tokenizer.json"))
    if kind == "gpt2":
        added = config.get("added") or {}
        if not isinstance(added, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in added.values()):
            raise UserError(f"{config_path}: \"added\" must map each added special token to its id")
        return GPT2Tokenizer.from_rank_file(directory / config.get("file", "gpt2.tiktoken"), added)
    raise UserError(f"{config_path}: unknown tokenizer kind {kind!r}")


def _load_char(config: dict, config_path: Path) -> CharTokenizer:
    """A char tokenizer's config: "chars" (sorted characters, then the specials) or, for ids kept
    from another program's file, "pieces" (each id's piece, null where none) and "unk"."""
    if "pieces" in config:
        pieces, unk = config["pieces"], config.get("unk")
        if not isinstance(pieces, list) or not all(p is None or isinstance(p, str) for p in pieces) or not (
                unk is None or isinstance(unk, str)):
            raise UserError(f"{config_path}: a char tokenizer's \"pieces\" must be a list of strings and nulls")
        ids = {p: i for i, p in enumerate(pieces) if p is not None}
        if len(ids) != sum(p is not None for p in pieces):
            raise UserError(f"{config_path}: a piece appears twice in \"pieces\"")
        try:
            return CharTokenizer.from_ids(ids, unk)
        except UserError as exc:
            raise UserError(f"{config_path}: {exc}") from None
    chars = config.get("chars")
    if not isinstance(chars, str):
        raise UserError(f"{config_path}: a char tokenizer needs \"chars\" as a string of characters, got {chars!r}")
    return CharTokenizer(chars, unk=bool(config.get("unk", False)))
