"""`scratchlm tokenize`: text -> pieces -> ids, and the training row those ids become.

What the data pipeline does to every document, shown on one text: the tokenizer cuts it into
pieces, each piece has an id, a BOS id goes in front (scratchlm.data.preparation writes every
document as BOS + its ids), and a window of T + 1 ids becomes one training row: x = row[:-1] is
the input, y = row[1:] the targets, so position t learns to predict the token at t + 1.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from scratchlm.text.pieces import complete_pieces


def visible(text: str) -> str:
    r"""Whitespace made visible (space ␣, newline ↵, tab ⇥) and nothing a terminal would act on:
    the other C0 controls and DEL drawn as their Unicode pictures (NUL ␀, ESC ␛, CR ␍, DEL ␡, as
    the playground draws them), and the C1 controls, the invisible format characters (zero-width
    space, bidirectional overrides, BOM) and the line and paragraph separators escaped, e.g. \x9b,
    \u202e."""
    text = text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
    return "".join(_shown(c) for c in text) if any(_acts(c) for c in text) else text


def _acts(c: str) -> bool:
    """Would this character move the cursor, reorder or hide text, or start an escape sequence?"""
    return unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")


def _shown(c: str) -> str:
    if not _acts(c):
        return c
    code = ord(c)
    if code < 0x20:
        return chr(0x2400 + code)  # ␀ .. ␟
    if code == 0x7F:
        return "\u2421"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def piece_labels(tokenizer: Any, ids: list[int]) -> list[str]:
    """One label per id: the text of its piece, whitespace visible; an id that is only part of a
    character (a byte-level piece) is labelled with the whole character and its place, 猫[1/3]."""
    labels = []
    for group, text in complete_pieces(tokenizer, ids):
        shown = visible(text)
        labels += [shown] if len(group) == 1 else [f"{shown}[{k + 1}/{len(group)}]" for k in range(len(group))]
    return labels


def tokenize_report(tokenizer: Any, text: str, source: str, block_size: int | None = None) -> dict[str, Any]:
    """Everything `scratchlm tokenize` prints, as plain data."""
    ids = tokenizer.encode(text)
    row = [tokenizer.bos_id, *ids][: None if block_size is None else block_size + 1]
    pieces = complete_pieces(tokenizer, ids)
    return {
        "tokenizer": tokenizer.kind, "source": source, "vocab_size": tokenizer.vocab_size,
        "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id, "text": text, "ids": ids,
        "pieces": [{"ids": group, "text": piece} for group, piece in pieces],
        "row": row, "x": row[:-1], "y": row[1:],
        "round_trip": tokenizer.decode(ids) == text,
        "characters": len(text), "bytes": len(text.encode("utf-8")),
    }


def format_tokenize(report: dict[str, Any], tokenizer: Any) -> str:
    ids, pieces = report["ids"], report["pieces"]
    lines = [f"tokenizer: {report['tokenizer']} ({report['source']}), vocabulary {report['vocab_size']:,}, "
             f"BOS id {report['bos_id']}, end id {report['eos_id']}",
             f"text: {report['characters']} characters, {report['bytes']} UTF-8 bytes -> {len(ids)} tokens "
             f"({report['bytes'] / max(len(ids), 1):.2f} bytes per token)", "",
             "pieces (whitespace shown as \u2423 \u21b5 \u21e5, control characters as \u2400 \u241b or \\x9b; ids "
             "that only together form a character are joined with +):"]
    for p in pieces:
        lines.append(f"  {'+'.join(map(str, p['ids'])):>18}  {visible(p['text'])}")
    lines += ["", f"decode(ids) == text: {report['round_trip']}", "",
              "the training row: BOS, then the ids (a document's start); x = row[:-1] is the input,"
              " y = row[1:] the target:",
              f"  row  {report['row']}", f"  x    {report['x']}", f"  y    {report['y']}", "",
              "  position  input -> target (what the model must predict there)"]
    labels = ["<BOS>", *piece_labels(tokenizer, ids)]  # the row is BOS + ids, cut to block_size + 1
    for t, (a, b) in enumerate(zip(report["x"], report["y"])):
        lines.append(f"  {t:>8}  {a:>6} {labels[t]:<8} -> {b:>6} {labels[t + 1]}")
    return "\n".join(lines)
