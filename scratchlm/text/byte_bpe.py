"""Byte-level BPE tokenizers: one trained on the user's text with Hugging Face `tokenizers`
(`bpe`), and GPT-2's own 50,257 tokens through `tiktoken` (`gpt2`). Both spell every UTF-8 byte,
so any text round-trips; both encode through tiktoken where they can (a tiktoken twin of a trained
vocabulary gives the same ids, faster). The interface they share with the char tokenizer is
described in scratchlm.text.tokenizer, which also loads and builds them."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from scratchlm.errors import UserError
from scratchlm.text.pieces import BYTE_OF_CHAR
from scratchlm.text.token_names import (
    BOS, CONFIG_FILE, EOS, GPT2_EOT_ID, GPT2_PATTERN, cpu_count, is_special_spelling, write_json,
)

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

    @property
    def specials(self) -> dict[str, int]:
        """Each special token's spelling -> its id."""
        return {t.content: i for i, t in sorted(self._tok.get_added_tokens_decoder().items()) if t.special}

    def with_tokens(self, specials: Sequence[str] = (), chars: Iterable[str] = ()) -> "BPETokenizer":
        """This vocabulary with every id kept, then each of `specials` it lacks at the next free
        ids, as Hugging Face's add_special_tokens appends them. `chars` is taken for the char
        kind's sake: every character already has ids here (byte-level)."""
        from tokenizers import AddedToken, Tokenizer

        new = [t for t in dict.fromkeys(specials) if self._tok.token_to_id(t) is None]
        if not new:
            return self
        grown = Tokenizer.from_str(self._tok.to_str())
        grown.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in new])
        return BPETokenizer(grown)

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
            return self._fast.encode_ordinary_batch(list(texts), num_threads=cpu_count())
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
            if i not in self.special_ids:
                lengths[i] = len(token)
        return lengths

    def save(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / "tokenizer.json"))
        write_json(directory / CONFIG_FILE, {"kind": self.kind, "file": "tokenizer.json"})

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
        self._specials = {t: encoding.encode_single_token(t) for t in encoding.special_tokens_set}
        self.special_ids = frozenset(self._specials.values())
        self._byte_lengths: np.ndarray | None = None

    @property
    def specials(self) -> dict[str, int]:
        """Each special token's spelling -> its id: <|endoftext|>, then those with_tokens added."""
        return dict(sorted(self._specials.items(), key=lambda kv: kv[1]))

    def with_tokens(self, specials: Sequence[str] = (), chars: Iterable[str] = ()) -> "GPT2Tokenizer":
        """GPT-2's vocabulary with each of `specials` it lacks at 50257, 50258, ... (`chars`: see
        BPETokenizer.with_tokens)."""
        known = self.specials
        new = [t for t in dict.fromkeys(specials) if t not in known]
        if not new:
            return self
        grown = known | {t: self.vocab_size + k for k, t in enumerate(new)}
        return GPT2Tokenizer(_gpt2_encoding(self._enc._mergeable_ranks, grown), rank_file=self.rank_file)

    @classmethod
    def from_rank_file(cls, path: str | os.PathLike, added: dict[str, int] | None = None) -> "GPT2Tokenizer":
        """GPT-2's ranks from a gpt2.tiktoken file; `added`: special tokens past <|endoftext|>
        (spelling -> id, as a saved tokenizer_config.json lists them)."""
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
        added = dict(added or {})
        if EOS in added or sorted(added.values()) != list(range(GPT2_EOT_ID + 1, GPT2_EOT_ID + 1 + len(added))) or not all(
                is_special_spelling(t) for t in added):
            raise UserError(f"{path}: the added special tokens {sorted(added)[:4]} must be spelled <|name|> and take "
                            f"the ids from {GPT2_EOT_ID + 1} on, one each")
        return cls(_gpt2_encoding(ranks, {EOS: GPT2_EOT_ID, **added}), rank_file=path)

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
        return self._enc.encode_ordinary_batch(list(texts), num_threads=cpu_count())

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
            self._byte_lengths[sorted(self.special_ids)] = 0
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
        config = {"kind": self.kind, "file": "gpt2.tiktoken"}
        added = {t: i for t, i in self.specials.items() if t != EOS}
        if added:
            config["added"] = added
        write_json(directory / CONFIG_FILE, config)

    def __repr__(self) -> str:
        return f"GPT2Tokenizer(vocab_size={self.vocab_size})"


def _gpt2_encoding(ranks: dict[bytes, int], special_tokens: dict[str, int]):
    import tiktoken

    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=special_tokens)
