"""prepare in bounded memory (scratchlm/data/reading.py, cutting.py, encoding.py, writing.py):
streamed ids equal one-shot ids, and an interrupted prepare leaves nothing that looks finished.

The streaming sizes (piece length, read block, batch) are made tiny here, so a few KB of text
goes through every path a few GB would: documents cut into many pieces, UTF-8 characters split
between read blocks, many batches in flight on two threads, many shards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scratchlm.data.cutting as cutting
import scratchlm.data.encoding as encoding
import scratchlm.data.preparation as preparation
import scratchlm.data.reading as reading
from scratchlm.data import DataConfig, is_prepared, prepare, read_meta, read_split, split_for_encoding
from scratchlm.errors import UserError
from scratchlm.text.tokenizer import get_tokenizer, load_tokenizer, train_tokenizer

from conftest import SHARED_DATA
from helpers import file_snapshot, write_file

RANK_FILE = SHARED_DATA / "gpt2" / "gpt2.tiktoken"

POEM = "静夜思\n床前明月光，疑是地上霜。\n举头望明月，低头思故乡。\n"
DOCUMENTS = {
    "cjk": POEM * 40 + "春眠不觉晓处处闻啼鸟夜来风雨声花落知多少" * 30 + "。\n" + POEM * 10,
    "whitespace": "".join(f"word{i}," + " " * (i % 17) + "\t" * (i % 3) + "\r\n" * (i % 4) + "\n\n" * (i % 2)
                          for i in range(300)) + "   \n\n  ",
    "no newline": " ".join(f"It's {i} o'clock, don't you'll see—{i * 7}?!" for i in range(400)),
    "mixed": "".join(f"Ünïcödé {i}: 😀 naïve café; αβγ δ.\u3000全角　空格\xa0nbsp\x1cfs\n" for i in range(200)),
}


@pytest.fixture
def tiny_pieces(monkeypatch):
    """Streaming at toy sizes: 37-character pieces, 101-byte reads, 300-character batches."""
    monkeypatch.setattr(cutting, "CHUNK_CHARS", 37)
    monkeypatch.setattr(reading, "READ_BYTES", 101)
    monkeypatch.setattr(encoding, "BATCH_CHARS", 300)


def _one_shot(encode, bos: int, docs: list[str]) -> list[int]:
    """The stream by definition: BOS and each whole document encoded in one call."""
    return [t for doc in docs for t in [bos, *encode(doc)]]


def _stream(out: Path) -> list[int]:
    return np.asarray(read_split(out, "train")).tolist() + np.asarray(read_split(out, "val")).tolist()


def _write_inputs(folder: Path) -> list[Path]:
    """Each document as its own .txt file, and all of them again as one JSONL file."""
    paths = [write_file(folder / f"{i}.txt", doc) for i, doc in enumerate(DOCUMENTS.values())]
    jsonl = folder / "all.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in DOCUMENTS.values()),
                     encoding="utf-8")
    return [*paths, jsonl]


def _prepared(tmp_path: Path, tokenizer: str, **kw) -> tuple[Path, list[str]]:
    inputs = _write_inputs(tmp_path / "in")
    cfg = DataConfig(data=[str(p) for p in inputs], tokenizer=tokenizer, **kw)
    out = prepare(cfg, tmp_path / "out", progress=False, workers=2, shard_tokens=500)
    docs = list(DOCUMENTS.values()) * 2
    assert read_meta(out)["documents"] == len(docs) and read_meta(out)["forced_cuts"] == 0
    return out, docs


@pytest.mark.skipif(not RANK_FILE.is_file(), reason=f"GPT-2's rank file is not at {RANK_FILE}")
def test_streamed_gpt2_ids_equal_one_shot(tmp_path, tiny_pieces):
    out, docs = _prepared(tmp_path, "gpt2", tokenizer_file=str(RANK_FILE))
    tok = get_tokenizer("gpt2", tokenizer_file=RANK_FILE)
    assert _stream(out) == _one_shot(tok.encode, tok.bos_id, docs)
    assert len(read_meta(out)["shards"]["train"]) > 3  # the stream did span shards
    own = tok.for_thread()  # what each worker encodes with: a core of its own, the same ids
    assert own._enc._core_bpe is not tok._enc._core_bpe and own.encode(POEM * 3) == tok.encode(POEM * 3)


def test_streamed_bpe_ids_equal_hugging_faces_one_shot(tmp_path, tiny_pieces):
    out, docs = _prepared(tmp_path, "bpe", vocab_size=400)
    tok = load_tokenizer(out / "tokenizer")
    assert tok.cut_rule == "gpt2"
    assert _stream(out) == _one_shot(tok.encode_reference, tok.bos_id, docs)  # Hugging Face's own encoder


def test_streamed_char_ids_equal_one_shot(tmp_path, tiny_pieces):
    out, docs = _prepared(tmp_path, "char", split="documents")
    alphabet = sorted(set("".join(docs)))
    bos = len(alphabet)
    expected = _one_shot(lambda d: [alphabet.index(c) for c in d], bos, docs)
    stream = _stream(out)  # the documents split reorders whole documents: compare them as a multiset
    assert sorted(_documents(stream, bos)) == sorted(_documents(expected, bos))


def _documents(stream: list[int], bos: int) -> list[tuple[int, ...]]:
    cuts = [i for i, t in enumerate(stream) if t == bos] + [len(stream)]
    return [tuple(stream[a:b]) for a, b in zip(cuts, cuts[1:])]


def test_the_documents_were_cut_into_many_pieces(tiny_pieces):
    for name, doc in DOCUMENTS.items():
        pieces = split_for_encoding(doc, rule="gpt2")
        assert "".join(pieces) == doc and len(pieces) > 5, name


def test_a_tokenizer_of_unknown_pre_tokenization_is_never_cut(tmp_path, tiny_pieces):
    """A tokenizer.json from elsewhere (here: a Metaspace pre-tokenizer, which marks the start of
    every piece) is encoded a whole document at a time, so its ids are still one-shot ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.train_from_iterator(DOCUMENTS.values(), trainers.BpeTrainer(vocab_size=300, special_tokens=["<|bos|>", "<|endoftext|>"]))
    hf.save(str(tmp_path / "tokenizer.json"))
    inputs = _write_inputs(tmp_path / "in")
    out = prepare(DataConfig(data=[str(p) for p in inputs], tokenizer="bpe", tokenizer_file=str(tmp_path / "tokenizer.json")),
                  tmp_path / "out", progress=False, workers=2)
    tok = load_tokenizer(out / "tokenizer")
    assert tok.cut_rule is None
    assert _stream(out) == _one_shot(tok.encode_reference, tok.bos_id, list(DOCUMENTS.values()) * 2)


@settings(max_examples=150, deadline=None)
@given(text=st.lists(st.sampled_from([*"ab Z9 .,!-'’\n\t\r", "中文", "，", "。", "\u3000", "\xa0", "\x1c", "\x85", "'s",
                                      " 's", "'ll", "é", "😀", "\r\n", "   ", "<|endoftext|>", "<|bos|>"]),
                     max_size=60).map("".join),
       target=st.integers(1, 12))
def test_every_cut_keeps_the_ids(text, target):
    """All three kinds of safe place (after a newline, before a space, letter|mark), on text made
    of the characters that come nearest to breaking them."""
    pieces = split_for_encoding(text, target, rule="gpt2")
    assert "".join(pieces) == text
    for tok in _cut_tokenizers():
        whole = tok.encode_reference(text) if hasattr(tok, "encode_reference") else tok.encode(text)
        assert [t for p in pieces for t in tok.encode(p)] == whole
        assert np.concatenate([tok.encode_array(p) for p in pieces] or [np.zeros(0)]).tolist() == whole


_CUT_TOKENIZERS: list = []


def _cut_tokenizers() -> list:
    if not _CUT_TOKENIZERS:
        _CUT_TOKENIZERS.append(train_tokenizer("bpe", [" ".join(DOCUMENTS.values())], vocab_size=400))
        if RANK_FILE.is_file():
            _CUT_TOKENIZERS.append(get_tokenizer("gpt2", tokenizer_file=RANK_FILE))
    return _CUT_TOKENIZERS


# GPT-2's pre-tokenizer on Python's re, whose \\s is str.isspace: U+001C..U+001F are white space
# to it, as they are not to tiktoken's and Hugging Face's engines (letters: [^\\W\\d_], so the text
# below has no underscore). A cut must keep the pre-tokens of the widest engine too.
_ISSPACE_GPT2 = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def test_separators_u001c_to_u001f_are_white_space_to_the_cut_search(tmp_path, monkeypatch):
    """Before a newline, U+001C..U+001F are white space to str.isspace (the file, group, record
    and unit separators): a piece ending "\\x1c\\n" makes that one pre-token, where the whole text,
    with a letter after the newline, makes it two. Here they are the only white space besides the
    newlines, and the streamed pieces (tiny reads, every piece length) keep the pre-tokens."""
    monkeypatch.setattr(reading, "READ_BYTES", 7)
    text = "".join(f"{word}{mark}{sep}\n" for word in ("ab", "Zed", "cafe", "x")
                   for mark in ",.;!" for sep in "\x1c\x1d\x1e\x1f")
    path = write_file(tmp_path / "t.txt", text)
    whole = _ISSPACE_GPT2.findall(text)
    assert _ISSPACE_GPT2.findall("ab,\x1c\n") == ["ab", ",", "\x1c\n"]  # at a piece's end: one pre-token
    for target in range(1, 13):
        cutter = cutting.Cutter("gpt2", target)
        pieces = [p.text for p, _ in reading.source_pieces(reading.Source(path, "txt"), "strict", cutter)]
        assert "".join(pieces) == text and len(pieces) > 20 and cutter.forced == 0
        assert [t for p in pieces for t in _ISSPACE_GPT2.findall(p)] == whole, target
        for tok in _cut_tokenizers():
            assert [t for p in pieces for t in tok.encode(p)] == tok.encode(text)


def test_a_run_with_no_safe_place_is_cut_by_force_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(cutting, "CHUNK_CHARS", 50)
    monkeypatch.setattr(cutting, "MAX_PIECE_CHARS", 200)
    letters = "".join(chr(0x4E00 + (i * 7919) % 500) for i in range(1000))  # Han only: one pre-token
    write_file(tmp_path / "t.txt", letters + "\n")
    out = prepare(DataConfig(data=str(tmp_path / "t.txt"), tokenizer="bpe", vocab_size=300), tmp_path / "out",
                  progress=False)
    assert read_meta(out)["forced_cuts"] == 5  # 1001 characters, no safe place: cut at 200, 400, 600, 800, 1000


def test_the_bpe_sample_stays_within_its_budget_over_many_small_files(tmp_path, monkeypatch):
    """Each file gives at most its share, however small the file: 40 files of 2,000 bytes and a
    budget of 4,000 bytes hand the trainer 4,000 bytes, not 80,000."""
    import scratchlm.text.tokenizer as tokenizer_module

    monkeypatch.setattr(preparation, "BPE_SAMPLE_BYTES", 4000)
    for i in range(40):
        write_file(tmp_path / "in" / f"{i:02d}.txt", f"file {i:02d} says hello\n" * 100)  # 2,000 bytes each
    seen: list[str] = []
    train = tokenizer_module.train_tokenizer

    def recording(kind, texts, *args, **kw):
        return train(kind, (seen.append(t) or t for t in texts), *args, **kw)

    monkeypatch.setattr(tokenizer_module, "train_tokenizer", recording)
    out = prepare(DataConfig(data=str(tmp_path / "in"), tokenizer="bpe", vocab_size=300), tmp_path / "out", progress=False)
    assert sum(len(t.encode()) for t in seen) <= 4000 and len(seen) == 40  # 100 bytes from each file
    assert read_meta(out)["tokenizer_trained_on"].startswith("a sample")


def test_a_lone_surrogate_escape_in_jsonl_is_one_error_line_or_replaced(tmp_path):
    """JSON may spell half a surrogate pair (\\ud83d, a cut emoji); text cannot hold it."""
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "fine line"}\n{"text": "cut emoji \\ud83d here"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"d.jsonl line 2: .* lone surrogate"):
        prepare(DataConfig(data=str(src), tokenizer="char"), tmp_path / "strict", progress=False)
    assert not (tmp_path / "strict").exists()
    out = prepare(DataConfig(data=str(src), tokenizer="char", errors="replace", val_fraction=0.0), tmp_path / "replaced",
                  progress=False)
    tok = load_tokenizer(out / "tokenizer")
    text = tok.decode([t for t in _stream(out) if t != tok.bos_id])
    assert text == "fine line" + "cut emoji \ufffd here"


def test_json_nested_too_deeply_is_one_error_line(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "ok"}\n' + "[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"d.jsonl line 2: not valid JSON \(nested too deeply\)"):
        prepare(DataConfig(data=str(src), tokenizer="char"), tmp_path / "out", progress=False)


def test_bpe_trains_on_a_bounded_sample_from_every_file(tmp_path, monkeypatch, capfd):
    """Over budget, each file gives the front of its share: a word only in a file's tail is
    not learned, words from both files are."""
    monkeypatch.setattr(preparation, "BPE_SAMPLE_BYTES", 40_000)
    monkeypatch.setattr(cutting, "CHUNK_CHARS", 1000)
    write_file(tmp_path / "a.txt", "apple banana cherry\n" * 2000 + "zyzzyva quokka\n" * 2000)
    write_file(tmp_path / "b.txt", "mango papaya guava\n" * 2000)
    cfg = DataConfig(data=[str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], tokenizer="bpe", vocab_size=300)
    out = prepare(cfg, tmp_path / "out", progress=False)
    assert read_meta(out)["tokenizer_trained_on"].startswith("a sample")
    assert "trained the bpe tokenizer on a sample" in capfd.readouterr().err
    vocab = load_tokenizer(out / "tokenizer")._tok.get_vocab()
    assert "Ġbanana" in vocab and "Ġpapaya" in vocab and "Ġquokka" not in vocab


# ------------------------------------------------------------------------------ interrupted

_KILL_AFTER_FIRST_SHARD = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell that starts jobs in the background ignores it
import scratchlm.data.writing as writing
finish = writing.ShardWriter._finish
def finish_then_stop(self):
    finish(self)
    if self.prefix == "part" and len(self.shards) == 2:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
writing.ShardWriter._finish = finish_then_stop
from scratchlm.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def _prepare_command(inputs: Path, out: Path) -> list[str]:
    return ["prepare", "--data", str(inputs), "--tokenizer", "char", "--out", str(out), "--shard-tokens", "2000"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_an_interrupted_prepare_leaves_nothing_that_looks_finished(tmp_path, sig):
    """Ctrl-C (SIGINT) or a kill part-way through encoding, once two shards are finished: the
    folder holds no shard and no meta.json, is not taken as prepared, and the same command run
    again gives exactly what an uninterrupted run gives."""
    inputs = write_file(tmp_path / "in.txt", POEM * 2000)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", _KILL_AFTER_FIRST_SHARD, sig, *_prepare_command(inputs, out)],
                          capture_output=True, text=True, timeout=300)
    if sig == "SIGINT":
        assert proc.returncode == 130 and proc.stderr.strip().splitlines()[-1] == "interrupted"
        assert not out.exists()  # prepare made the folder, so it takes it away again, staging and all
    else:
        assert proc.returncode == -signal.SIGKILL
        staged = [p.name for p in out.rglob("*") if p.is_file()]
        assert "part-00001.bin" in staged and not any(n.startswith(("train-", "val-")) or n == "meta.json" for n in staged)
    assert not is_prepared(out)
    with pytest.raises(UserError):
        read_split(out, "train")

    rerun = subprocess.run([sys.executable, "-m", "scratchlm", *_prepare_command(inputs, out)], capture_output=True,
                           text=True, timeout=300)
    clean = subprocess.run([sys.executable, "-m", "scratchlm", *_prepare_command(inputs, tmp_path / "clean")],
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0 and clean.returncode == 0, rerun.stderr + clean.stderr
    assert _stream(out) == _stream(tmp_path / "clean")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "clean").iterdir())


def test_an_interrupt_keeps_the_previous_output_whole(tmp_path, monkeypatch):
    """Ctrl-C part-way through re-preparing a folder leaves the earlier output exactly as it was."""
    import scratchlm.data.writing as writing

    src = write_file(tmp_path / "t.txt", POEM * 300)
    cfg = DataConfig(data=str(src), tokenizer="char")
    out = prepare(cfg, tmp_path / "out", progress=False, shard_tokens=1000)
    before = file_snapshot(out)
    write_file(src, POEM * 400)
    finish = writing.ShardWriter._finish

    def finish_then_interrupt(self):
        finish(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(writing.ShardWriter, "_finish", finish_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, out, progress=False, shard_tokens=1000)
    assert file_snapshot(out) == before
    assert not any(p.name.startswith(".staging-") for p in out.iterdir())


def test_workers_do_not_change_the_output(tmp_path, tiny_pieces):
    inputs = _write_inputs(tmp_path / "in")
    cfg = DataConfig(data=[str(p) for p in inputs], tokenizer="char")
    one = prepare(cfg, tmp_path / "one", progress=False, workers=1, shard_tokens=700)
    two = prepare(cfg, tmp_path / "two", progress=False, workers=2, shard_tokens=700)
    for name in ["meta.json", *[s["file"] for split in ("train", "val") for s in read_meta(one)["shards"][split]]]:
        if name != "meta.json":
            assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert {k: v for k, v in read_meta(one).items() if k not in ("seconds", "workers")} == \
        {k: v for k, v in read_meta(two).items() if k not in ("seconds", "workers")}
    assert os.path.getsize(one / "train-00000.bin") > 0


def test_each_worker_encodes_with_a_tiktoken_core_of_its_own(tmp_path, tiny_pieces, monkeypatch):
    """Threads sharing one tiktoken core share its regex caches and lose them to each other (2-3x
    the CPU): each worker takes its own copy, and the copy gives Hugging Face's own ids."""
    from scratchlm.text.tokenizer import BPETokenizer

    made: list[tuple[int, object, object]] = []
    real = BPETokenizer.for_thread

    def spy(self):
        twin = real(self)
        made.append((threading.get_ident(), self._fast, twin._fast))
        return twin

    monkeypatch.setattr(BPETokenizer, "for_thread", spy)
    out, docs = _prepared(tmp_path, "bpe", vocab_size=400)
    tok = load_tokenizer(out / "tokenizer")
    assert _stream(out) == _one_shot(tok.encode_reference, tok.bos_id, docs)
    assert 1 <= len(made) <= 2 and len({t for t, _, _ in made}) == len(made)  # one copy per pool thread
    assert all(own is not None and own._core_bpe is not shared._core_bpe for _, shared, own in made)
    assert len({id(own._core_bpe) for _, _, own in made}) == len(made)


def test_the_large_corpus_section_names_the_code_s_limits():
    """docs/own-data.md and its Chinese twin quote the shard size, the BPE sample and the forced
    cut length: the code's constants, not numbers typed once and left to drift."""
    from scratchlm.data.config import BPE_SAMPLE_BYTES, DEFAULT_SHARD_TOKENS, MAX_PIECE_CHARS

    docs = Path(__file__).resolve().parent.parent / "docs"
    en, zh = (docs / "own-data.md").read_text(encoding="utf-8"), (docs / "zh" / "own-data.md").read_text(encoding="utf-8")
    for page in (en, zh):
        assert f"默认 {DEFAULT_SHARD_TOKENS:,}" in page or f"(default {DEFAULT_SHARD_TOKENS:,})" in page
        assert f"前 {BPE_SAMPLE_BYTES // 10**6} MB" in page or f"first {BPE_SAMPLE_BYTES // 10**6} MB" in page
    assert f"{MAX_PIECE_CHARS // 10**6} million characters" in en
    assert f"{MAX_PIECE_CHARS // 10**4} 万个字符" in zh
