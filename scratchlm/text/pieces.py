"""Token ids grouped into whole characters: what `scratchlm tokenize`, the walkthrough and the
attention maps label as one piece when a character's UTF-8 bytes are spread over several
byte-level tokens."""

from __future__ import annotations

from typing import Any, Sequence


def complete_pieces(tokenizer: Any, ids: Sequence[int]) -> list[tuple[list[int], str]]:
    """The ids grouped so that each group decodes to whole characters: a byte-level token that
    holds part of a character's UTF-8 bytes (猫 is three bytes, often three GPT-2 tokens) is
    joined with the tokens that complete it, however many that takes (a token may hold the end
    of one character, whole ones and the start of the next). A special id is a group of its own.
    Returns (ids, text) per group; a group still incomplete at the end, or holding bytes that
    are no UTF-8, keeps the replacement characters its decoding gives. A tokenizer without
    token_bytes (characters) has whole characters in every id."""
    token_bytes = getattr(tokenizer, "token_bytes", None)
    if token_bytes is None:
        return [([int(i)], tokenizer.decode([int(i)])) for i in ids]
    groups: list[tuple[list[int], str]] = []
    group: list[int] = []
    pending = b""
    for i in map(int, ids):
        piece = token_bytes(i)
        if piece is None:  # a special id
            if group:
                groups.append((group, tokenizer.decode(group)))
            groups.append(([i], tokenizer.decode([i])))
            group, pending = [], b""
            continue
        group.append(i)
        pending += piece
        if _whole_characters(pending):
            groups.append((group, tokenizer.decode(group)))
            group, pending = [], b""
    if group:
        groups.append((group, tokenizer.decode(group)))
    return groups


def _whole_characters(data: bytes) -> bool:
    """Whether `data` ends at a character's end: it decodes, or fails on bytes no later byte can
    mend (only a character cut off at the end waits for the next token)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.reason != "unexpected end of data"
    return True


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's spelling of bytes as characters (GPT-2's, which Hugging Face's ByteLevel
    uses): a printable Latin-1 byte is its own character; the 68 others (controls, space, the
    soft hyphen ...) are spelled U+0100 upwards, in byte order. Returns {character: byte}."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


BYTE_OF_CHAR = _byte_level_alphabet()
"""{character: byte} of byte-level BPE vocabularies."""
