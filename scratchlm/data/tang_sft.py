"""`--data tang-sft`: requests for poems, made from the built-in Tang corpus, for the sft stage.

Every poem of the corpus in a regular form (4 or 8 clauses, all 5 or all 7 Han characters, two a
line) gives one conversation, a request in the fixed words of scratchlm.text.verse_requests and
the poem itself as the reply. The kinds take turns over the poems: a title request (its own title,
form and size), a 藏头 request (a 绝句 only: its own first characters as heads) and a 续写 request
(its first line; the reply the rest). Titles longer than 12 characters are left out.

A poem whose title falls in the held-out share (one in HELD_OUT_EVERY, by a hash of the title) is
never in the training file: `held-out` holds those, so a request there names a title and a poem
that training never saw. Both files are built once, beside the corpus, and read as ordinary JSONL.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator

from scratchlm.fileio import atomic_write
from scratchlm.text.verse import HAN, clauses, in_form
from scratchlm.text.verse_requests import continue_request, heads_request, title_request

NAME = "tang-sft"
SPLITS = ("train", "held-out")
HELD_OUT_EVERY = 16
MAX_TITLE = 12
VERSION = 2
"""Of the rules above: a change builds the files again."""


def is_tang_sft(data) -> bool:
    return data == NAME


def held_out(title: str) -> bool:
    return hashlib.sha256(title.encode("utf-8")).digest()[0] % HELD_OUT_EVERY == 0


def regular_poem(text: str) -> tuple[str, list[str], int] | None:
    """(title, lines, clause length) of a corpus document in a regular form, or None."""
    title, *lines = text.rstrip("\n").split("\n")
    if not lines or len(lines) not in (2, 4) or len(title) > MAX_TITLE or not title.strip():
        return None
    parts = [clauses(line) for line in lines]
    if not all(in_form(line) and len(p) == 2 for line, p in zip(lines, parts)):
        return None
    lengths = {len(c) for p in parts for c in p}
    return (title, lines, lengths.pop()) if len(lengths) == 1 else None


def requests(documents: Iterator[str]) -> Iterator[tuple[str, dict]]:
    """(split, conversation row) for each regular poem, the kinds taking turns (see the module)."""
    turn = 0
    for text in documents:
        poem = regular_poem(text)
        if poem is None:
            continue
        title, lines, length = poem
        kind = ("title", "heads", "continue")[turn % 3]
        if kind == "heads" and len(lines) != 2:
            kind = "title"  # 藏头 asks for a 绝句
        turn += 1
        heads = "".join(c[0] for line in lines for c in clauses(line))
        if kind == "heads" and not HAN.fullmatch(heads):
            kind = "title"
        if kind == "title":
            prompt, reply = title_request(length, 2 * len(lines), title), "\n".join(lines)
        elif kind == "heads":
            prompt, reply = heads_request(length, heads), "\n".join(lines)
        else:
            prompt, reply = continue_request(lines[0]), "\n".join(lines[1:])
        yield ("held-out" if held_out(title) else "train"), {"prompt": prompt, "completion": reply}


def tang_sft(split: str = "train", *, progress: bool | None = None) -> Path:
    """The JSONL file of `split` (train or held-out), built on first use from the Tang corpus."""
    from scratchlm.text.tang import tang_corpus

    corpus = tang_corpus("tang", progress=progress)
    paths = {s: corpus.with_name(f"{corpus.stem}-sft{VERSION}-{s}.jsonl") for s in SPLITS}
    if not all(p.is_file() for p in paths.values()):
        with open(corpus, encoding="utf-8") as f, atomic_write(paths["train"], "w") as train, \
                atomic_write(paths["held-out"], "w") as held:
            out = {"train": train, "held-out": held}
            for where, row in requests(json.loads(line)["text"] for line in f):
                out[where].write(json.dumps(row, ensure_ascii=False) + "\n")
    return paths[split]
