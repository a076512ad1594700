"""`scratchlm tokenize` never prints a character a terminal would act on: control characters are
drawn as their Unicode pictures (NUL ␀, ESC ␛) and invisible or reordering ones escaped (\\x9b,
\\u202e), so a text holding an escape sequence is shown, not run."""

from __future__ import annotations

import io
import json
import unicodedata

import pytest

from scratchlm.cli.main import main
from scratchlm.inside.tokenize_view import visible


@pytest.mark.parametrize("text, shown", [
    ("a b\tc\nd", "a\u2423b\u21e5c\u21b5d"),  # whitespace as before
    ("\x00\x1b[31m\r\x7f", "\u2400\u241b[31m\u240d\u2421"),  # C0 controls and DEL: pictures
    ("x\x9by\x85", "x\\x9by\\x85"),  # C1 controls: escaped
    ("\u202eevil\u200b\ufeff\u2028", "\\u202eevil\\u200b\\ufeff\\u2028"),  # bidi override, zero width, BOM, separator
    ("\U000e0041", "\\U000e0041"),  # a tag character, past the BMP
    ("naïve 東京 🎭 ␀", "naïve\u2423東京\u2423🎭\u2423␀"),  # printable text untouched
])
def test_visible_draws_or_escapes_what_a_terminal_would_act_on(text, shown):
    assert visible(text) == shown


def test_tokenize_prints_nul_and_esc_as_pictures_not_raw(capsys, monkeypatch):
    text = "a\x00b\x1b[2Jc\x9bd\u202ee\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8"))
    assert main(["tokenize"]) == 0
    out = capsys.readouterr().out
    acting = {c for c in out if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}
    assert not acting, sorted(map(hex, map(ord, acting)))
    for shown in ("\u2400", "\u241b", "\\x9b", "\\u202e"):
        assert shown in out


def test_the_playground_draws_a_tokens_control_characters_as_tokenize_does():
    """One drawing of control characters (tokenize_view.visible) for the terminal and the page: a
    token event's labels and the attention tab's labels show NUL, ESC, DEL, a C1 control and a bidi
    override exactly as hand-written here, never raw."""
    from types import SimpleNamespace

    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT
    from scratchlm.serve.app import Limits, attention_data
    from scratchlm.serve.labels import Labels
    from scratchlm.text.tokenizer import CharTokenizer

    tok = CharTokenizer("a\x1b\x00\u202e\x7f\x9b\n ")
    text = "\x00\x1b\n \x7f\x9b\u202ea"
    expected = ["\u2400", "\u241b", "\u21b5", "\u2423", "\u2421", "\\x9b", "\\u202e", "a"]
    assert [json.loads(Labels(tok)[i]) for i in tok.encode(text)] == expected
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=8)).eval()
    assert attention_data(SimpleNamespace(model=model, tokenizer=tok), text, Limits())["labels"] == expected
