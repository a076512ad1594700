"""One rule for a byte-order mark: a UTF-8 BOM at the start of a text file is not text.

Some editors (Windows Notepad among them) begin a UTF-8 file with the bytes EF BB BF, the
character U+FEFF, to mark the encoding. Every reader of the user's text drops it there: prepare
and train --data (text and .jsonl files), eval --data, generate --prompt-file or a prompt on stdin,
tokenize from stdin. So it is never learned as a character by one command and refused as '\\ufeff'
by another. A U+FEFF anywhere else is kept: inside text it is a character like any other.
"""

from __future__ import annotations

import codecs
import os
import sys

from scratchlm.errors import UserError

BOM = "\ufeff"


def without_bom(text: str) -> str:
    """`text` without the BOM it starts with, if it starts with one."""
    return text[1:] if text.startswith(BOM) else text


def stdin_text(max_chars: int, what: str = "stdin") -> str:
    """Up to `max_chars` + 1 characters of standard input as UTF-8 text, BOM dropped, read as
    `--data` reads a file: bytes that are not UTF-8 are one error line. Python's own text stdin
    lets them through as lone surrogates (under a C or UTF-8 locale), which no tokenizer can
    encode. One character more than asked is kept, so a caller can tell input that was too long."""
    limit = 4 * (max_chars + 1)  # a character is at most 4 bytes
    data = sys.stdin.buffer.read(limit)
    try:  # not final when cut at the limit: a character cut in two there is no error
        text = codecs.getincrementaldecoder("utf-8")().decode(data, final=len(data) < limit)
    except UnicodeDecodeError as exc:
        raise UserError(f"{what}: not UTF-8 text (a bad byte at offset {exc.start})") from None
    return without_bom(text[:max_chars + 1])


def argument_text(text: str, what: str) -> str:
    """A text given on the command line, its bytes that are not UTF-8 one error line as on stdin
    (Python hands them over as lone surrogates)."""
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what}: not UTF-8 text (a bad byte at offset {exc.start})") from None
