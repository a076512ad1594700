"""`scratchlm tokenize`: text -> pieces -> ids -> the training row, for the char, bpe and gpt2
tokenizers and a run's own, on English, Chinese and mixed text. The pieces are checked against
the text itself and the ids against an encoder outside scratchlm (tiktoken for gpt2, Hugging
Face tokenizers for bpe, the sorted alphabet for char)."""

from __future__ import annotations

import json

import pytest

from scratchlm.cli.main import main
from conftest import SHARED_DATA, needs_shared

TEXTS = {
    "english": "The cat sat on the mat.\nThe dog sat too.",
    "chinese": "床前明月光，疑是地上霜。举头望明月，低头思故乡。",
    "mixed": "The cat 爱 the mat。 Ünïcödé — 😀 ok",
}
GPT2_FILE = SHARED_DATA / "gpt2" / "gpt2.tiktoken"


def _run(capsys, *argv) -> dict:
    assert main(["tokenize", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def _check_row(report: dict) -> None:
    row, ids = report["row"], report["ids"]
    assert row == [report["bos_id"], *ids]
    assert report["x"] == row[:-1] and report["y"] == row[1:]
    assert "".join(p["text"] for p in report["pieces"]) == report["text"]
    assert [i for p in report["pieces"] for i in p["ids"]] == ids


@pytest.mark.parametrize("name", TEXTS)
def test_char_ids_are_places_in_the_sorted_alphabet(capsys, name):
    text = TEXTS[name]
    report = _run(capsys, text)
    alphabet = sorted(set(text))
    assert report["ids"] == [alphabet.index(c) for c in text]
    assert report["round_trip"] and report["vocab_size"] == len(alphabet) + 2
    _check_row(report)


@pytest.mark.parametrize("name", TEXTS)
def test_bpe_pieces_join_byte_tokens_into_characters(capsys, name):
    text = TEXTS[name]
    report = _run(capsys, "--tokenizer", "bpe", "--vocab-size", "270", text)
    assert report["round_trip"]
    _check_row(report)
    for p in report["pieces"]:  # each piece is whole characters: its UTF-8 bytes decode on their own
        assert "\ufffd" not in p["text"]
    if name != "english":  # a character of 2 to 4 bytes with few merges takes several tokens
        assert any(len(p["ids"]) > 1 for p in report["pieces"])


def _minimal_whole_pieces(report: dict, tokenizer) -> None:
    """Brute force with decode alone: every piece decodes to whole characters, and none could be
    cut in two (each of its proper prefixes decodes with a character cut off)."""
    for p in report["pieces"]:
        assert "\ufffd" not in p["text"], p
        for k in range(1, len(p["ids"])):
            assert "\ufffd" in tokenizer.decode(p["ids"][:k]), (p, k)


@pytest.mark.parametrize("vocab_size", ["262", "300", "400"])
def test_bpe_pieces_of_the_poem_take_as_many_tokens_as_a_character_needs(capsys, vocab_size):
    """Issue 33: with the default 300 ids, 霜's three bytes end one token of four and start the
    next; grouping at most four tokens printed `疑是地上\ufffd` and lost 霜."""
    from scratchlm.text.tokenizer import train_tokenizer

    text = TEXTS["chinese"]
    report = _run(capsys, "--tokenizer", "bpe", "--vocab-size", vocab_size, text)
    _check_row(report)
    tokenizer = train_tokenizer("bpe", [text], int(vocab_size))
    assert tokenizer.encode(text) == report["ids"]  # the same tokenizer the command trained
    _minimal_whole_pieces(report, tokenizer)
    assert any("霜" in p["text"] for p in report["pieces"])
    # the bytes read back from the byte-level vocabulary are the text's own
    assert b"".join(tokenizer.token_bytes(i) for i in report["ids"]) == text.encode("utf-8")
    assert tokenizer.token_bytes(tokenizer.bos_id) is None


@needs_shared("gpt2/gpt2.tiktoken")
@pytest.mark.parametrize("name", TEXTS)
def test_gpt2_ids_equal_tiktoken(capsys, name):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    text = TEXTS[name]
    report = _run(capsys, "--tokenizer", "gpt2", "--tokenizer-file", str(GPT2_FILE), text)
    enc = tiktoken.Encoding(name="gpt2-file", mergeable_ranks=load_tiktoken_bpe(str(GPT2_FILE)),
                            pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                            special_tokens={"<|endoftext|>": 50256})
    assert report["ids"] == enc.encode_ordinary(text)
    assert report["bos_id"] == 50256 and report["round_trip"]
    _check_row(report)
    from scratchlm.text.tokenizer import get_tokenizer

    _minimal_whole_pieces(report, get_tokenizer("gpt2", tokenizer_file=str(GPT2_FILE)))


def test_a_runs_tokenizer_and_the_text_view(tmp_path, capsys):
    from scratchlm.training.checkpoint import save_model_checkpoint
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT
    from scratchlm.text.tokenizer import CharTokenizer

    tok = CharTokenizer("abc ")
    save_model_checkpoint(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=1, n_embd=4)),
                          tok, tmp_path / "ckpt")
    report = _run(capsys, "--checkpoint", str(tmp_path / "ckpt"), "--block-size", "3", "cab ba")
    assert report["ids"] == [3, 1, 2, 0, 2, 1]  # sorted alphabet: space a b c
    assert report["row"] == [tok.bos_id, 3, 1, 2] and report["y"] == [3, 1, 2]
    assert main(["tokenize", "--checkpoint", str(tmp_path / "ckpt"), "cab ba"]) == 0
    text = capsys.readouterr().out
    assert "<BOS>" in text and "decode(ids) == text: True" in text
    assert main(["tokenize", "--checkpoint", str(tmp_path / "ckpt"), "xyz"]) == 2  # not in the run's alphabet
    assert "'x'" in capsys.readouterr().err
