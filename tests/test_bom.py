"""One rule for a UTF-8 byte-order mark (scratchlm.text.text_files): at the start of a text file it is
not text, and every reader drops it; anywhere else U+FEFF is a character like any other. Each
reader is checked on a file that starts with the BOM bytes EF BB BF: prepare and train --data
(.txt and .jsonl), eval --data, generate --prompt-file and a prompt on stdin, tokenize from stdin,
and the built-in corpus's play files."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from scratchlm.cli.main import main
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.text.tokenizer import CharTokenizer, load_tokenizer

BOM_BYTES = b"\xef\xbb\xbf"  # U+FEFF in UTF-8, written out by hand
TEXT = "ROMEO:\nBut soft, what light\n"


def _cli(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def bom_file(tmp_path) -> Path:
    path = tmp_path / "bom.txt"
    path.write_bytes(BOM_BYTES + TEXT.encode("utf-8"))
    return path


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """A model whose char tokenizer knows TEXT's characters and not U+FEFF."""
    tok = CharTokenizer(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16))
    from scratchlm.checkpoint import save_model_checkpoint

    return save_model_checkpoint(model, tok, tmp_path / "ckpt")


def test_prepare_reads_text_and_jsonl_without_the_bom(tmp_path, bom_file, capsys):
    from scratchlm.data import DataConfig, iter_documents

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_bytes(BOM_BYTES + b'{"text": "first"}\n{"text": "second \xef\xbb\xbf kept"}\n')
    docs = list(iter_documents(DataConfig(data=[str(bom_file), str(jsonl)])))
    assert docs == [TEXT, "first", "second \ufeff kept"]  # a U+FEFF inside the text stays
    code, _, err = _cli(["prepare", "--data", bom_file, "--tokenizer", "char", "--out", tmp_path / "prep"], capsys)
    assert code == 0, err
    assert load_tokenizer(tmp_path / "prep" / "tokenizer").chars == sorted(set(TEXT))


def test_eval_scores_a_file_that_starts_with_a_bom(tmp_path, bom_file, checkpoint, capsys):
    plain = tmp_path / "plain.txt"
    plain.write_text(TEXT, encoding="utf-8")
    scores = []
    for path in (bom_file, plain):
        code, out, err = _cli(["eval", "--checkpoint", checkpoint, "--data", path, "--json", "--device", "cpu"], capsys)
        assert code == 0, err
        scores.append({k: v for k, v in json.loads(out).items() if k not in ("data", "path", "file")})
    assert scores[0] == scores[1]  # the same text, scored the same


def test_generate_prompt_file_and_stdin_drop_the_bom(bom_file, checkpoint, capsys, monkeypatch):
    base = ["generate", "--checkpoint", checkpoint, "--greedy", "--max-new-tokens", "3", "--device", "cpu"]
    code, from_file, err = _cli(base + ["--prompt-file", bom_file], capsys)
    assert code == 0, err
    code, from_arg, err = _cli(base + ["--prompt", TEXT], capsys)
    assert code == 0 and from_file == from_arg and from_arg.startswith(TEXT), err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(BOM_BYTES + TEXT.encode()), encoding="utf-8"))
    code, from_stdin, err = _cli(base, capsys)
    assert code == 0 and from_stdin == from_arg, err


def test_tokenize_from_stdin_drops_the_bom(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(BOM_BYTES + b"ab"), encoding="utf-8"))
    code, out, err = _cli(["tokenize", "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["text"] == "ab" and report["ids"] == [0, 1], err


def test_the_corpus_reads_a_play_file_without_the_bom(tmp_path, monkeypatch):
    import scratchlm.text.corpus as corpus

    play = tmp_path / "play.md"
    play.write_bytes(BOM_BYTES + b"**ROMEO**\n\nBut soft\n")
    monkeypatch.setattr(corpus, "shakespeare_files", lambda: [play])
    assert [text for _, text in corpus.shakespeare_documents()] == ["ROMEO:\nBut soft\n"]
