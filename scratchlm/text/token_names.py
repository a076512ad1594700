"""What every tokenizer kind shares: the special tokens' spellings, the saved config's name, GPT-2's
pre-tokenisation pattern and sizes, and two small helpers. Kept apart so that the kinds' modules
(scratchlm.text.tokenizer for characters, scratchlm.text.byte_bpe for byte-level BPE) import it and
not each other."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

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

_SPECIAL_SPELLING = re.compile(r"<\|[a-z_]{1,32}\|>")


def is_special_spelling(piece: str) -> bool:
    """Whether `piece` is spelled as a special token is: <|name|>, a short lowercase name
    (<|bos|>, <|endoftext|>, the chat template's <|user|>, ...)."""
    return bool(_SPECIAL_SPELLING.fullmatch(piece))


def cpu_count() -> int:
    return max(1, os.cpu_count() or 1)


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
