"""`scratchlm tokenize`: text -> pieces -> ids -> the training row, for the char, bpe and gpt2
tokenizers and a run's own, on English, Chinese and mixed text. The pieces are checked against
the text itself and the ids against an encoder outside scratchlm (tiktoken for gpt2, Hugging
Face tokenizers for bpe, the sorted alphabet for char)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

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
    from scratchlm.checkpoint import save_model_checkpoint
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


def _command(*argv: str, stdin: bytes = b"", command: str = "tokenize") -> subprocess.CompletedProcess:
    """`python -m scratchlm COMMAND ARGV` with `stdin`, in UTF-8 mode: Python's stdin then lets
    bytes that are not UTF-8 through as lone surrogates (as a C or C.UTF-8 locale does), the case
    that once ended in a traceback."""
    env = {**os.environ, "PYTHONUTF8": "1"}
    return subprocess.run([sys.executable, "-m", "scratchlm", command, *argv], input=stdin, capture_output=True,
                          env=env, timeout=120)


def test_random_bytes_on_stdin_are_one_error_line():
    data = random.Random(0).randbytes(3000)
    with pytest.raises(UnicodeDecodeError) as bad:  # where Python's own codec first stops
        data.decode("utf-8")
    done = _command(stdin=data)
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode() == f"error: stdin: not UTF-8 text (a bad byte at offset {bad.value.start})\n"


def test_random_bytes_in_the_argument_are_one_error_line():
    data = random.Random(0).randbytes(300).replace(b"\0", b"")  # an argument cannot hold a NUL
    with pytest.raises(UnicodeDecodeError) as bad:
        data.decode("utf-8")
    done = _command(os.fsdecode(data))  # the bytes the process gets in its argv
    assert done.returncode == 2 and done.stdout == b""
    expected = f"error: the text argument: not UTF-8 text (a bad byte at offset {bad.value.start})\n"
    assert done.stderr.decode() == expected


def test_chinese_on_stdin_is_tokenized_as_the_same_argument():
    text = TEXTS["chinese"]
    piped, given = _command("--json", stdin=text.encode("utf-8")), _command("--json", text)
    assert piped.returncode == 0 and given.returncode == 0, (piped.stderr, given.stderr)
    assert piped.stdout == given.stdout
    alphabet = sorted(set(text))
    assert json.loads(piped.stdout)["ids"] == [alphabet.index(c) for c in text]


def test_random_bytes_as_generates_prompt_are_one_error_line(tmp_path):
    """generate reads its prompt (stdin or --prompt) by the same rule, before it loads a model."""
    data = random.Random(1).randbytes(3000).replace(b"\0", b"")
    with pytest.raises(UnicodeDecodeError) as bad:
        data.decode("utf-8")
    where = ["--checkpoint", str(tmp_path / "never-read")]
    piped = _command(*where, stdin=data, command="generate")
    assert piped.returncode == 2 and piped.stdout == b""
    assert piped.stderr.decode() == f"error: the prompt on stdin: not UTF-8 text (a bad byte at offset {bad.value.start})\n"
    given = _command(*where, "--prompt", os.fsdecode(data[:300]), command="generate")
    assert given.returncode == 2 and given.stdout == b""
    assert given.stderr.decode().startswith("error: --prompt: not UTF-8 text (a bad byte at offset ")
