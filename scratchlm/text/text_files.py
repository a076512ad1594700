"""One rule for a byte-order mark: a UTF-8 BOM at the start of a text file is not text.

Some editors (Windows Notepad among them) begin a UTF-8 file with the bytes EF BB BF, the
character U+FEFF, to mark the encoding. Every reader of the user's text drops it there: prepare
and train --data (text and .jsonl files), eval --data, generate --prompt-file or a prompt on stdin,
tokenize from stdin. So it is never learned as a character by one command and refused as '\\ufeff'
by another. A U+FEFF anywhere else is kept: inside text it is a character like any other.
"""

from __future__ import annotations

BOM = "\ufeff"


def without_bom(text: str) -> str:
    """`text` without the BOM it starts with, if it starts with one."""
    return text[1:] if text.startswith(BOM) else text
