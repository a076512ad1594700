"""How a token is shown on the page: its text with whitespace and control characters visible."""

from __future__ import annotations

import json
from typing import Any


def shown(label: str) -> str:
    r"""A label with every control character drawn as its Unicode picture (\x03 as ␃, DEL as ␡),
    so no token is invisible on the page."""
    return "".join(chr(0x2400 + ord(c)) if ord(c) < 0x20 else "\u2421" if c == "\x7f" else c for c in label)


def id_label(tokenizer: Any, token: int) -> str:
    """A token shown alone: its text with whitespace and control characters visible; a byte-level
    piece of a character (no whole character of its own) as its id."""
    from scratchlm.tokenize_view import visible

    text = tokenizer.decode([token])
    if "\ufffd" in text:
        return f"[byte piece #{token}]"
    return shown(visible(text)) or f"[#{token}]"


class Labels(dict):
    """id -> id_label as a JSON string literal, each made once per model (a token event carries
    six labels, and the event is written as JSON text around them)."""

    def __init__(self, tokenizer: Any):
        super().__init__()
        self.tokenizer = tokenizer

    def __missing__(self, token: int) -> str:
        self[token] = literal = json.dumps(id_label(self.tokenizer, token), ensure_ascii=False)
        return literal
