"""What `prepare` is asked to do: DataConfig, the record of where the text comes from and how it
becomes token shards (saved inside every checkpoint), and the choices it names."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from scratchlm.errors import ConfigError

TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
BUILT_IN = ("shakespeare", "tang", "tang-traditional")
"""The built-in corpora --data names: Shakespeare's plays, and the Tang poems in simplified or
traditional characters (scratchlm.text.corpus, scratchlm.text.tang)."""
SPLITS = ("tail", "documents")
ERRORS = ("strict", "replace")
DEFAULT_BPE_VOCAB = 8192
CHUNK_CHARS = 1 << 20
"""Long documents are cut into pieces of about this many characters (scratchlm.data.cutting)."""
MAX_PIECE_CHARS = 32_000_000
"""A piece with no safe place to cut is cut here anyway (counted in meta.json as a forced cut)."""
DEFAULT_SHARD_TOKENS = 100_000_000
"""Token ids per shard file (the last shard of a split holds the rest)."""
BPE_SAMPLE_BYTES = 100_000_000
"""--tokenizer bpe trains on at most this much of the input's text (each file its share)."""


@dataclass
class DataConfig:
    """Where the text comes from and how it becomes token shards. Saved inside every checkpoint."""

    data: str | list[str] = "shakespeare"
    """`shakespeare` or `tang` (built-in corpora; `tang-traditional` keeps the poems' traditional
    characters), or one or more paths: .txt files (one document each),
    .jsonl (one document per line, field `text`), .parquet (one per row, column `text`), or folders
    of them (read recursively, in sorted order)."""
    tokenizer: str = "bpe"
    """`char`, `bpe` (trained on the data) or `gpt2` (GPT-2's fixed 50257-token BPE)."""
    vocab_size: int | None = None
    """Vocabulary size to train `bpe` to (None: 8192). char and gpt2 fix their own size."""
    tokenizer_file: str | None = None
    """gpt2: a `gpt2.tiktoken` rank file (the offline path). bpe: a tokenizer.json to use instead
    of training. Any kind: a tokenizer directory saved by scratchlm."""
    val_fraction: float = 0.1
    """Share of the tokens (tail split) or of the documents (documents split) held out."""
    split: str = "tail"
    """`tail`: the last val_fraction of the token stream; `documents`: a seeded random set of documents."""
    seed: int = 0
    """Seed of the documents split."""
    errors: str = "strict"
    """Invalid UTF-8 in the input: `strict` stops with the file and byte offset, `replace` uses U+FFFD."""
    char_unk: bool = False
    """char only: add an `<unk>` id for characters the training text lacked (else they are an error)."""
    block_size: int | None = None
    """If set, each non-empty split must hold at least one window of block_size + 1 tokens.
    A check only: it does not change what is written."""

    def __post_init__(self) -> None:
        if isinstance(self.data, (list, tuple)):
            self.data = [str(p) for p in self.data]
            if len(self.data) == 1:
                self.data = self.data[0]
        elif isinstance(self.data, os.PathLike):
            self.data = os.fspath(self.data)
        if self.tokenizer_file is not None:
            self.tokenizer_file = os.fspath(self.tokenizer_file)
        self.validate()

    def validate(self) -> None:
        from scratchlm.text.tokenizer import KINDS

        if not self.data:
            raise ConfigError("data", "give a built-in corpus (shakespeare, tang, tang-traditional) or at least one path")
        if self.tokenizer not in KINDS:
            raise ConfigError("tokenizer", f"{self.tokenizer!r} is not one of {', '.join(KINDS)}")
        if self.vocab_size is not None:
            if self.tokenizer != "bpe":
                raise ConfigError("vocab_size", f"only bpe is trained to a chosen size; {self.tokenizer}'s vocabulary is fixed by "
                                  + ("the input's characters" if self.tokenizer == "char" else "GPT-2 (50257)"))
            if self.vocab_size <= 0:
                raise ConfigError("vocab_size", f"must be positive, got {self.vocab_size}")
            if self.tokenizer_file is not None:
                raise ConfigError("vocab_size", "a loaded tokenizer (tokenizer_file) has its own size; give one or the other")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError("val_fraction", f"must be in [0, 1), got {self.val_fraction}")
        if self.split not in SPLITS:
            raise ConfigError("split", f"{self.split!r} is not one of {', '.join(SPLITS)}")
        if self.errors not in ERRORS:
            raise ConfigError("errors", f"{self.errors!r} is not one of {', '.join(ERRORS)}")
        if self.char_unk and self.tokenizer != "char":
            raise ConfigError("char_unk", "only the char tokenizer has an <unk> id")
        if self.block_size is not None and self.block_size <= 0:
            raise ConfigError("block_size", f"must be positive, got {self.block_size}")

    @property
    def paths(self) -> list[str]:
        return [self.data] if isinstance(self.data, str) else list(self.data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DataConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
