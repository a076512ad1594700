"""`scratchlm prepare` given bad input (scratchlm/data/preparation.py through the command line):
one error line holding the words that say what is wrong, and every file byte-identical, in this
process and as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scratchlm.data import read_split
from scratchlm.text.tokenizer import load_tokenizer

from helpers import file_snapshot, write_file

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------- bad input via the CLI

BAD_INPUTS = {
    # name: (files to create, prepare flags, words the error line must hold)
    "empty input": ({"e.txt": b""}, ["--data", "{d}/e.txt", "--tokenizer", "char"], ["no text found"]),
    "shorter than a window": ({"s.txt": b"tiny text"}, ["--data", "{d}/s.txt", "--tokenizer", "char", "--block-size", "64"],
                              ["fewer than one window", "65"]),
    "folder without text": ({"docs/notes.md": b"# not read"}, ["--data", "{d}/docs"], ["no .txt, .jsonl or .parquet"]),
    "folder of empty text": ({"docs/a.txt": b"", "docs/b.jsonl": b""}, ["--data", "{d}/docs"], ["no text found"]),
    "invalid utf-8": ({"bad.txt": b"hello\n\xffworld"}, ["--data", "{d}/bad.txt"], ["bad.txt", "byte offset 6", "--errors replace"]),
    "invalid utf-8 in jsonl": ({"bad.jsonl": b'{"text": "ok"}\n{"text": "b\xc3("}\n'}, ["--data", "{d}/bad.jsonl"],
                               ["bad.jsonl line 2", "byte offset 26"]),
    "parquet without text": (None, ["--data", "{d}/p.parquet"], ["p.parquet", 'no "text" column', "body"]),
    "vocab below bytes": ({"ok.txt": b"plenty of text\n" * 20}, ["--data", "{d}/ok.txt", "--vocab-size", "100"],
                          ["byte alphabet", "258"]),
    "missing path": ({}, ["--data", "{d}/nowhere.txt"], ["no such file or folder"]),
    "unknown characters": ({"t.txt": b"abc cab!", "tok/tokenizer_config.json": b'{"kind": "char", "chars": "abc"}'},
                           ["--data", "{d}/t.txt", "--tokenizer", "char", "--tokenizer-file", "{d}/tok"],
                           ["not in the char tokenizer's vocabulary", "' '", "'!'"]),
    "one document, documents split": ({"one.txt": b"a single document\n" * 20}, ["--data", "{d}/one.txt", "--split", "documents"],
                                      ["all 1 document(s)"]),
    "vocab for char": ({"ok.txt": b"text\n"}, ["--data", "{d}/ok.txt", "--tokenizer", "char", "--vocab-size", "50"],
                       ["vocab_size"]),
}


def _make_bad_input(name: str, d: Path) -> list[str]:
    """Create the case's files and an earlier prepare's output in d; return the prepare argv."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files, flags, _ = BAD_INPUTS[name]
    if files is None:
        pq.write_table(pa.table({"body": ["a", "b"]}), d / "p.parquet")
    else:
        for rel, content in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(content)
    out = d / "out"  # an earlier prepare's output (its marker says so) that a failed run must leave alone
    (out / "tokenizer").mkdir(parents=True)
    for rel, content in {"train-00000.bin": b"old train", "val-00000.bin": b"old val", "meta.json": b"{}",
                         "tokenizer/tokenizer_config.json": b"{}", ".scratchlm-output": b"scratchlm prepare\n"}.items():
        (out / rel).write_bytes(content)
    return ["prepare", *[f.format(d=d) for f in flags], "--out", str(out)]


def _check_bad_input_result(name: str, code: int, stderr: str, before: dict, d: Path) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for words in BAD_INPUTS[name][2]:
        assert words in lines[0], (words, lines[0])
    assert file_snapshot(d) == before  # every file byte-identical, nothing added (no staging folder left)
    assert not any(p.name.startswith(".") and p.name != ".scratchlm-output" for p in d.rglob("*"))


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_gives_one_error_line_and_touches_nothing(tmp_path, capsys, monkeypatch, name):
    from scratchlm.cli.main import main

    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "case"
    d.mkdir()
    argv = _make_bad_input(name, d)
    before = file_snapshot(d)
    code = main(argv)
    _check_bad_input_result(name, code, capsys.readouterr().err, before, d)


def _run_cli_processes(tmp_path: Path, names: list[str]) -> None:
    """Each case as its own `python -m scratchlm prepare`, all started at once (each process spends
    most of its time importing torch, so running them side by side saves time)."""
    runs = {}
    for i, name in enumerate(names):
        d = tmp_path / f"case{i}"
        d.mkdir()
        argv = [sys.executable, "-m", "scratchlm", *_make_bad_input(name, d)]
        before = file_snapshot(d)
        env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
        runs[name] = (subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env),
                      d, before)
    for name, (proc, d, before) in runs.items():
        _, stderr = proc.communicate(timeout=300)
        _check_bad_input_result(name, proc.returncode, stderr, before, d)


def test_bad_input_as_a_process(tmp_path):
    _run_cli_processes(tmp_path, ["invalid utf-8"])


@pytest.mark.slow
def test_every_bad_input_as_a_process(tmp_path):
    _run_cli_processes(tmp_path, list(BAD_INPUTS))


def test_cli_prepare_success_with_errors_replace(tmp_path):
    write_file(tmp_path / "ok.txt", "")
    (tmp_path / "bad.txt").write_bytes("good text, ".encode() * 10 + b"\xff end\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "scratchlm", "prepare", "--data", str(tmp_path / "bad.txt"), "--tokenizer", "char",
         "--errors", "replace", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "c")}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "MB/s" in proc.stdout and "train" in proc.stdout
    tok = load_tokenizer(out / "tokenizer")
    stream = read_split(out, "train").tolist() + read_split(out, "val").tolist()
    assert tok.decode(stream[1:]) == "good text, " * 10 + "\ufffd end\n"
