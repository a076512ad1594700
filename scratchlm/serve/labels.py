"""How a token is shown on the page: its text as `scratchlm tokenize` shows it (tokenize_view.visible:
whitespace visible, control characters drawn as their pictures or escaped)."""

from __future__ import annotations

import json
from typing import Any

from scratchlm.inside.tokenize_view import visible


def id_label(tokenizer: Any, token: int) -> str:
    """A token shown alone: its text with whitespace and control characters visible; a byte-level
    piece of a character (no whole character of its own) as its id."""
    text = tokenizer.decode([token])
    if "\ufffd" in text:
        return f"[byte piece #{token}]"
    return visible(text) or f"[#{token}]"


class Labels(dict):
    """id -> id_label as a JSON string literal, each made once per model (a token event carries
    six labels, and the event is written as JSON text around them)."""

    def __init__(self, tokenizer: Any):
        super().__init__()
        self.tokenizer = tokenizer

    def __missing__(self, token: int) -> str:
        self[token] = literal = json.dumps(id_label(self.tokenizer, token), ensure_ascii=False)
        return literal
