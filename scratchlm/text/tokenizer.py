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

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from scratchlm.errors import UserError
from scratchlm.text.pieces import BYTE_OF_CHAR

BOS = "<|bos|>"
EOS = "<|endoftext|>"
UNK = "<unk>"
CONFIG_FILE = "tokenizer_config.json"
KINDS = ("char", "bpe", "gpt2")

# GPT-2's pre-tokenisation regex: contractions, letter runs, digit runs, punctuation runs (each
# with an optional leading space), then whitespace. BPE merges never cross these pieces.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_VOCAB_SIZE = 50257
GPT2_EOT_ID = 50256


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


def _cpu_count() -> int:
    return max(1, os.cpu_count() or 1)


# ----------------------------------------------------------------------------------------------
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
        _write_json(directory / CONFIG_FILE, config)

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
    odd = [p for p in ids if len(p) != 1 and p not in (BOS, EOS, UNK)]
    if odd:
        raise UserError(f"piece {odd[0]!r} is neither one character nor {BOS}, {EOS} or {UNK}; "
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


# ----------------------------------------------------------------------------------------------
# bpe (Hugging Face tokenizers)


class BPETokenizer:
    """Byte-level BPE from Hugging Face `tokenizers`, with <|bos|> and <|endoftext|> special ids.

    Training and the saved file are Hugging Face's. Encoding has two paths that give the same ids:
    Hugging Face's own (`encode_reference`, the plain path) and, where the vocabulary allows it, a
    tiktoken Encoding built from the same vocabulary (over ten times faster here: 0.4 s instead of
    10 s for the 4.8 MB Shakespeare corpus). tiktoken merges the adjacent pair whose joined bytes
    have the lowest id; a trained BPE gives each merge's result the next free id, so "lowest id"
    is "earliest merge" and the two agree. A vocabulary where that does not hold (two merges
    making one string, ids out of merge order) keeps Hugging Face's encoder."""

    kind = "bpe"

    def __init__(self, hf_tokenizer):
        self._tok = hf_tokenizer
        # Text is encoded literally: "<|endoftext|>" typed by a user stays characters.
        self._tok.encode_special_tokens = True
        bos, eos = self._tok.token_to_id(BOS), self._tok.token_to_id(EOS)
        if bos is None or eos is None:
            raise UserError(f"this BPE tokenizer lacks the special tokens {BOS} and {EOS}; train one with scratchlm")
        self.bos_id, self.eos_id = bos, eos
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._fast = _tiktoken_twin(self._tok, {BOS: bos, EOS: eos})
        # Where a text may be cut without changing its ids (scratchlm.data.cutting): GPT-2's rule
        # for a plain byte-level pre-tokenizer; any other (a tokenizer.json from elsewhere) is
        # not cut at all.
        self.cut_rule = "gpt2" if _plain_byte_level(json.loads(self._tok.to_str())) else None
        # what Hugging Face's decode(skip_special_tokens=True) leaves out
        self.special_ids = frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8192, *, length: int | None = None) -> "BPETokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet) + 2:
            raise UserError(
                f"--vocab-size {vocab_size} is smaller than the byte alphabet: byte-level BPE needs at least "
                f"{len(alphabet)} byte tokens + 2 special tokens = {len(alphabet) + 2}"
            )
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[BOS, EOS],
            initial_alphabet=alphabet,  # all 256 bytes, so no input is ever unknown
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer, length=length)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "BPETokenizer":
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)))
        except UserError:
            raise
        except Exception as exc:  # the Rust side raises plain Exception on a bad file
            raise UserError(f"{path}: not a Hugging Face tokenizer.json file ({exc})") from None

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode_ordinary(text)
        return self.encode_reference(text)

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of encode(text) as an array (uint32 or int64), without a Python list between."""
        if self._fast is not None:
            return self._fast.encode_to_numpy(text, disallowed_special=())
        return np.array(self.encode_reference(text), dtype=np.int64)

    def for_thread(self) -> "BPETokenizer":
        """The same tokenizer with an encoder of its own, for one of several threads (own_core)."""
        twin = copy.copy(self)
        if self._fast is not None:
            twin._fast = own_core(self._fast)
        return twin

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._fast is not None:
            return self._fast.encode_ordinary_batch(list(texts), num_threads=_cpu_count())
        # The Rust side spreads the batch over all cores.
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode_reference(self, text: str) -> list[int]:
        """Hugging Face's encoder: the definition the fast path is checked against."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self, i: int) -> bytes | None:
        """The bytes id `i` stands for (None for a special id): a byte-level vocabulary spells
        each byte as one printable character (BYTE_OF_CHAR reads it back)."""
        if i in self.special_ids:
            return None
        token = self._tok.id_to_token(i)
        if token is None or any(c not in BYTE_OF_CHAR for c in token):  # not a byte-level vocabulary
            return self.decode([i]).encode("utf-8")
        return bytes(BYTE_OF_CHAR[c] for c in token)

    def token_byte_lengths(self) -> np.ndarray:
        """(vocab_size,) UTF-8 bytes each id stands for; 0 for special ids. A byte-level vocabulary
        spells each byte as one printable character, so a token's length is its byte count."""
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for token, i in self._tok.get_vocab(with_added_tokens=True).items():
            if i not in (self.bos_id, self.eos_id):
                lengths[i] = len(token)
        return lengths

    def save(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / "tokenizer.json"))
        _write_json(directory / CONFIG_FILE, {"kind": self.kind, "file": "tokenizer.json"})

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte -> the one printable character that spells it in a
    byte-level BPE vocabulary. Printable Latin-1 bytes stand for themselves; the other 68 (controls,
    the space, ...) take chr(256), chr(257), ... in byte order, so the space is 'Ġ' and the newline 'Ċ'."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def _plain_byte_level(model: dict) -> bool:
    """A tokenizer.json (parsed) that splits text with GPT-2's pre-tokenizer and nothing else."""
    pre = model.get("pre_tokenizer") or {}
    return (not model.get("normalizer") and pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space")
            and pre.get("use_regex", True))


def _tiktoken_twin(hf_tokenizer, special_tokens: dict[str, int]):
    """A tiktoken Encoding with the same ids as a byte-level BPE tokenizer, or None when the two
    could disagree (not plain byte-level BPE, or a merge result appearing twice)."""
    import tiktoken

    model = json.loads(hf_tokenizer.to_str())
    bpe = model["model"]
    if bpe.get("type") != "BPE" or bpe.get("dropout") or bpe.get("ignore_merges") or not _plain_byte_level(model):
        return None
    merges = [m.split(" ") if isinstance(m, str) else m for m in bpe["merges"]]
    results = [a + b for a, b in merges]
    if len(set(results)) != len(results):
        return None
    byte_of = {ch: b for b, ch in byte_alphabet().items()}
    ranks: dict[bytes, int] = {}
    for token, i in bpe["vocab"].items():
        if token in special_tokens:
            continue
        if any(ch not in byte_of for ch in token):
            return None
        ranks[bytes(byte_of[ch] for ch in token)] = i
    # The merge order must match the id order for tiktoken's rule to reproduce it.
    merge_ids = [bpe["vocab"].get(r) for r in results]
    if None in merge_ids or merge_ids != sorted(merge_ids):
        return None
    return tiktoken.Encoding(name="scratchlm-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=special_tokens)


def own_core(encoding):
    """A tiktoken Encoding equal to `encoding` with a core of its own, for one thread.

    tiktoken's pattern (GPT-2's, with its lookahead) runs on fancy-regex, whose inner regexes
    and their caches are shared by every thread using that core. A thread that finds the shared
    cache busy gets a cold one, built again from nothing, so two threads on one core can spend
    twice the CPU of two threads with a core each (measured: 28-45 s against 13-14 s for 300 MB
    on 2 threads). Building one takes about 20 ms."""
    import tiktoken

    return tiktoken.Encoding(name=encoding.name, pat_str=encoding._pat_str,
                             mergeable_ranks=encoding._mergeable_ranks, special_tokens=encoding._special_tokens)


# ----------------------------------------------------------------------------------------------
# gpt2 (tiktoken)


class GPT2Tokenizer:
    """GPT-2's BPE via tiktoken. <|endoftext|> (50256) is both BOS and EOS, as in GPT-2."""

    kind = "gpt2"

    def __init__(self, encoding, rank_file: Path | None = None):
        self._enc = encoding
        self.rank_file = rank_file
        self.vocab_size = encoding.n_vocab
        self.bos_id = self.eos_id = encoding.eot_token
        self.special_ids = frozenset({encoding.eot_token})
        self._byte_lengths: np.ndarray | None = None

    @classmethod
    def from_rank_file(cls, path: str | os.PathLike) -> "GPT2Tokenizer":
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        path = Path(path)
        if not path.is_file():
            raise UserError(f"{path}: no such GPT-2 rank file (expected a gpt2.tiktoken file)")
        try:
            ranks = load_tiktoken_bpe(str(path))
        except Exception as exc:
            raise UserError(f"{path}: not a tiktoken rank file ({exc})") from None
        if len(ranks) != GPT2_EOT_ID:
            raise UserError(f"{path}: holds {len(ranks)} ranks, GPT-2's file has {GPT2_EOT_ID}")
        enc = tiktoken.Encoding(
            name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOS: GPT2_EOT_ID}
        )
        return cls(enc, rank_file=path)

    @classmethod
    def from_tiktoken(cls) -> "GPT2Tokenizer":
        import tiktoken

        try:
            return cls(tiktoken.get_encoding("gpt2"))
        except Exception as exc:
            raise UserError(
                f"could not load GPT-2's tokenizer through tiktoken (no network and no cached copy?: {exc}); "
                "pass --tokenizer-file path/to/gpt2.tiktoken"
            ) from None

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    cut_rule = "gpt2"
    """Where a text may be cut without changing its ids (scratchlm.data.cutting)."""

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of encode(text) as a uint32 array, without a Python list between (text that
        spells <|endoftext|> stays characters, as in encode)."""
        return self._enc.encode_to_numpy(text, disallowed_special=())

    def for_thread(self) -> "GPT2Tokenizer":
        """The same tokenizer with an encoder of its own, for one of several threads (own_core)."""
        twin = copy.copy(self)
        twin._enc = own_core(self._enc)
        return twin

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts), num_threads=_cpu_count())

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))

    def token_bytes(self, i: int) -> bytes | None:
        """The bytes id `i` stands for (None for <|endoftext|>)."""
        return None if i in self.special_ids else self._enc.decode_single_token_bytes(i)

    def token_byte_lengths(self) -> np.ndarray:
        """(vocab_size,) bytes each id stands for; 0 for <|endoftext|>. Computed once."""
        if self._byte_lengths is None:
            lengths = [len(self._enc.decode_single_token_bytes(i)) for i in range(self.vocab_size)]
            self._byte_lengths = np.array(lengths, dtype=np.int64)
            self._byte_lengths[self.eos_id] = 0
        return self._byte_lengths

    def save(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / "gpt2.tiktoken"
        if self.rank_file is not None:
            if self.rank_file.resolve() != target.resolve():
                shutil.copyfile(self.rank_file, target)
        else:
            # Came from tiktoken's download: write the ranks out so the directory stands alone.
            import base64

            lines = [
                base64.b64encode(self._enc.decode_single_token_bytes(i)).decode("ascii") + f" {i}"
                for i in range(GPT2_EOT_ID)
            ]
            target.write_text("\n".join(lines) + "\n", encoding="ascii")
        _write_json(directory / CONFIG_FILE, {"kind": self.kind, "file": "gpt2.tiktoken"})

    def __repr__(self) -> str:
        return "GPT2Tokenizer(vocab_size=50257)"


Tokenizer = CharTokenizer | BPETokenizer | GPT2Tokenizer


# ----------------------------------------------------------------------------------------------
# construction, saving, loading


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


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
        return GPT2Tokenizer.from_rank_file(directory / config.get("file", "gpt2.tiktoken"))
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
