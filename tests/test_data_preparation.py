"""Text to token shards (scratchlm/data/preparation.py): `prepare` (layout, splits, dtypes, its
output folder), the cache, DataConfig, and what mutation testing found. Bad input through the
command line is in test_data_bad_input.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scratchlm.data import (
    DataConfig,
    ensure_prepared,
    is_prepared,
    prepare,
    read_meta,
    read_shard,
    read_split,
    split_for_encoding,
)
from scratchlm.errors import UserError
from scratchlm.text.tokenizer import get_tokenizer, load_tokenizer, train_tokenizer

from conftest import SHARED_DATA, needs_shared
from helpers import file_snapshot, write_file

DATA = SHARED_DATA
GPT2_DIR = DATA / "gpt2"


# ------------------------------------------------------------------------------------- prepare


def _documents_of(stream: list[int], bos: int) -> list[list[int]]:
    """Split a token stream at its BOS ids (each document starts with one)."""
    assert stream and stream[0] == bos
    docs: list[list[int]] = []
    for t in stream:
        if t == bos:
            docs.append([])
        else:
            docs[-1].append(t)
    return docs


def test_prepare_char_bos_layout_tail_split_and_meta(tmp_path):
    texts = {"b.txt": "to be or not to be\n", "a.txt": "ça va? ok\n", "sub/c.txt": "the end\n" * 30}
    for name, text in texts.items():
        write_file(tmp_path / "in" / name, text)
    out = prepare(DataConfig(data=str(tmp_path / "in"), tokenizer="char"), tmp_path / "out", progress=False)

    order = ["a.txt", "b.txt", "sub/c.txt"]  # sorted by relative path
    alphabet = sorted(set("".join(texts.values())))
    bos, eos = len(alphabet), len(alphabet) + 1
    expected = [t for name in order for t in [bos] + [alphabet.index(c) for c in texts[name]]]
    train, val = read_split(out, "train"), read_split(out, "val")
    assert train.dtype == np.uint16
    assert train.tolist() + val.tolist() == expected
    assert len(train) == int(len(expected) * 0.9)  # nanoGPT's tail split

    meta = read_meta(out)
    assert (meta["tokenizer"], meta["vocab_size"], meta["bos_id"], meta["eos_id"]) == ("char", len(alphabet) + 2, bos, eos)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))
    chars = "".join(texts[name] for name in order)
    chars_in_train = len(train) - sum(1 for t in train.tolist() if t == bos)
    assert meta["train_bytes"] == len(chars[:chars_in_train].encode())
    assert meta["val_bytes"] == len(chars[chars_in_train:].encode())
    by_path = {Path(s["path"]).name: s for s in meta["sources"]}
    for name in order:
        raw = (tmp_path / "in" / name).read_bytes()
        assert by_path[Path(name).name]["sha256"] == hashlib.sha256(raw).hexdigest()
        assert by_path[Path(name).name]["bytes"] == len(raw)
    assert load_tokenizer(out / "tokenizer").encode("to be") == [alphabet.index(c) for c in "to be"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # no staging left behind


def test_prepare_jsonl_and_parquet_one_document_per_record(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl_docs = ["first line doc", "second\nwith newline", "ünï"]
    with open(tmp_path / "d.jsonl", "w", encoding="utf-8") as f:
        for i, d in enumerate(jsonl_docs):
            f.write(json.dumps({"text": d, "id": i}) + ("\n\n" if i == 0 else "\n"))
    parquet_docs = ["row zero", None, "row two", "row three", "row four"]
    pq.write_table(pa.table({"text": parquet_docs, "n": list(range(5))}), tmp_path / "d.parquet", row_group_size=2)
    assert pq.ParquetFile(tmp_path / "d.parquet").num_row_groups == 3

    out = prepare(DataConfig(data=[str(tmp_path / "d.jsonl"), str(tmp_path / "d.parquet")], tokenizer="bpe",
                             vocab_size=270, val_fraction=0.0), tmp_path / "out", progress=False)
    tok = load_tokenizer(out / "tokenizer")
    stream = read_split(out, "train").tolist()
    docs = [tok.decode(d) for d in _documents_of(stream, tok.bos_id)]
    assert docs == jsonl_docs + [d for d in parquet_docs if d is not None]
    assert read_meta(out)["val_tokens"] == 0


def test_prepare_documents_split_is_seeded_and_whole(tmp_path):
    docs = [f"document number {i}: " + "abc" * i for i in range(10)]
    for i, d in enumerate(docs):
        write_file(tmp_path / "in" / f"{i:02d}.txt", d)
    cfg = DataConfig(data=str(tmp_path / "in"), tokenizer="char", split="documents", val_fraction=0.3, seed=5)
    a = prepare(cfg, tmp_path / "a", progress=False)
    b = prepare(cfg, tmp_path / "b", progress=False)
    shards_a = {name: data for name, data in file_snapshot(a).items() if name.endswith(".bin")}
    assert "val-00000.bin" in shards_a and shards_a == {n: d for n, d in file_snapshot(b).items() if n.endswith(".bin")}
    tok = load_tokenizer(a / "tokenizer")
    train = [tok.decode(d) for d in _documents_of(read_split(a, "train").tolist(), tok.bos_id)]
    val = [tok.decode(d) for d in _documents_of(read_split(a, "val").tolist(), tok.bos_id)]
    assert len(val) == 3 and sorted(train + val) == sorted(docs)
    assert train == [d for d in docs if d in train]  # original order kept
    # "seeded" as documented: validation holds the documents the seed's permutation lists first
    # (np.random.default_rng(seed).permutation(n)[:n_val]), so each seed draws its own set
    # (MUTATION, issue 21: the last 3 documents, no RNG, passed the old determinism-only check)
    drawn = []
    for seed in (5, 6, 7, 8):
        out = prepare(DataConfig(**{**cfg.to_dict(), "seed": seed}), tmp_path / f"seed{seed}", progress=False)
        got = {tok.decode(d) for d in _documents_of(read_split(out, "val").tolist(), tok.bos_id)}
        assert got == {docs[i] for i in np.random.default_rng(seed).permutation(len(docs))[:3]}, seed
        drawn.append(frozenset(got))
    assert set(val) == drawn[0] and len(set(drawn)) > 1


def test_prepare_uint32_when_the_vocabulary_needs_it(tmp_path):
    code_points = [c for c in range(0x100, 0x100 + 66_000 + 2048) if not 0xD800 <= c <= 0xDFFF][:66_000]
    text = "".join(map(chr, code_points))
    write_file(tmp_path / "wide.txt", text)
    out = prepare(DataConfig(data=str(tmp_path / "wide.txt"), tokenizer="char", val_fraction=0.0), tmp_path / "out",
                  progress=False)
    train = read_split(out, "train")
    assert train.dtype == np.uint32 and read_meta(out)["dtype"] == "uint32"
    assert train.tolist() == [66_000] + list(range(66_000))  # BOS, then each character's sorted rank


@needs_shared("gpt2")
def test_prepare_gpt2_offline(tmp_path):
    text = "Hello world\n" * 50
    write_file(tmp_path / "t.txt", text)
    out = prepare(DataConfig(data=str(tmp_path / "t.txt"), tokenizer="gpt2",
                             tokenizer_file=str(GPT2_DIR / "gpt2.tiktoken")), tmp_path / "out", progress=False)
    stream = read_split(out, "train").tolist() + read_split(out, "val").tolist()
    assert stream[:4] == [50256, 15496, 995, 198]  # <|endoftext|> as BOS, "Hello", " world", "\n"
    assert (out / "tokenizer" / "gpt2.tiktoken").read_bytes() == (GPT2_DIR / "gpt2.tiktoken").read_bytes()


def test_prepare_replaces_its_own_output_and_refuses_a_folder_with_a_users_file(tmp_path):
    write_file(tmp_path / "one.txt", "first version of the text\n" * 5)
    cfg = DataConfig(data=str(tmp_path / "one.txt"), tokenizer="char")
    out = prepare(cfg, tmp_path / "out", progress=False)
    assert (out / ".scratchlm-output").read_text() == "scratchlm prepare\n"  # the marker that makes it prepare's
    write_file(tmp_path / "one.txt", "a second, different text!\n" * 9)
    prepare(cfg, out, progress=False)
    tok = load_tokenizer(out / "tokenizer")
    stream = read_split(out, "train").tolist() + read_split(out, "val").tolist()
    assert tok.decode(stream[1:]) == "a second, different text!\n" * 9
    assert sorted(p.name for p in out.iterdir()) == [".scratchlm-output", "meta.json", "tokenizer", "train-00000.bin", "val-00000.bin"]
    (out / "notes.txt").write_text("mine")
    before = file_snapshot(out)
    with pytest.raises(UserError, match=r"holds files that `scratchlm prepare` did not write \(notes.txt\)"):
        prepare(cfg, out, progress=False)
    assert file_snapshot(out) == before


def test_interrupted_prepare_leaves_the_old_output(tmp_path, monkeypatch):
    import scratchlm.data.preparation as data_module

    write_file(tmp_path / "t.txt", "old text\n" * 20)
    cfg = DataConfig(data=str(tmp_path / "t.txt"), tokenizer="char")
    out = prepare(cfg, tmp_path / "out", progress=False)
    before = file_snapshot(out)
    write_file(tmp_path / "t.txt", "new text\n" * 20)
    real_split = data_module.split_tail
    calls = []

    def split_then_interrupt(*args):
        calls.append(real_split(*args))
        raise KeyboardInterrupt  # as if Ctrl-C came after the train and val shards were written (in staging)

    monkeypatch.setattr(data_module, "split_tail", split_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, out, progress=False)
    assert calls and [s.name for s in calls[0][0]] == ["train-00000.bin"] and file_snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t.txt"]


@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab c\n\n\t\r.'sé中 ") + ["\u2028", "\x85"]), max_size=300),
       target=st.integers(1, 40))
@example(text="\n\na", target=1)  # a blank line before a letter: "\n\n" must not end a piece
@example(text="x\r\na", target=1)
def test_split_for_encoding_keeps_the_tokens(text, target):
    pieces = split_for_encoding(text, target)
    assert "".join(pieces) == text
    for tok in _split_tokenizers():
        assert [t for p in pieces for t in tok.encode(p)] == tok.encode(text)


_TOKENIZERS: list = []


def _split_tokenizers() -> list:
    if not _TOKENIZERS:
        _TOKENIZERS.append(train_tokenizer("bpe", ["abc abc\n\n ab c's sé 中中 " * 50], vocab_size=280))
        if GPT2_DIR.is_dir():
            _TOKENIZERS.append(get_tokenizer("gpt2", tokenizer_file=GPT2_DIR / "gpt2.tiktoken"))
    return _TOKENIZERS


# ------------------------------------------------------------------------------------- cache


def test_ensure_prepared_reuses_and_notices_changes(tmp_path, monkeypatch):
    src = write_file(tmp_path / "t.txt", "some text for the cache\n" * 20)
    cfg = DataConfig(data=str(src), tokenizer="char")
    first = ensure_prepared(cfg, tmp_path / "cache")
    assert is_prepared(first)
    stamp = (first / "meta.json").stat().st_mtime_ns

    import scratchlm.data.preparation as data_module

    def no_prepare(*args, **kwargs):
        raise AssertionError("should have reused the cache")

    monkeypatch.setattr(data_module, "prepare", no_prepare)
    assert ensure_prepared(cfg, tmp_path / "cache") == first
    assert (first / "meta.json").stat().st_mtime_ns == stamp
    monkeypatch.undo()

    # a different setting or changed source lands in another folder
    assert ensure_prepared(DataConfig(data=str(src), tokenizer="char", val_fraction=0.2), tmp_path / "cache") != first
    write_file(src, "the text changed\n" * 20)
    changed = ensure_prepared(cfg, tmp_path / "cache")
    assert changed != first and read_meta(changed)["sources"][0]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()

    # a folder without meta.json (an interrupted publish) is never used as it stands
    (changed / "meta.json").unlink()
    assert not is_prepared(changed)
    assert ensure_prepared(cfg, tmp_path / "cache") == changed and is_prepared(changed)


def test_ensure_prepared_env_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path / "envcache"))
    src = write_file(tmp_path / "t.txt", "hello there\n" * 10)
    out = ensure_prepared(DataConfig(data=str(src), tokenizer="char"))
    assert out.parent == tmp_path / "envcache" / "data"  # the variable names scratchlm's whole cache folder


# ------------------------------------------------------------------------------------- config


def test_data_config_checks_fields():
    from scratchlm.errors import ConfigError

    for bad, field in [(dict(tokenizer="words"), "tokenizer"), (dict(val_fraction=1.0), "val_fraction"),
                       (dict(tokenizer="char", vocab_size=100), "vocab_size"), (dict(split="random"), "split"),
                       (dict(errors="ignore"), "errors"), (dict(tokenizer="bpe", char_unk=True), "char_unk")]:
        with pytest.raises(ConfigError) as info:
            DataConfig(**bad)
        assert info.value.field == field
    cfg = DataConfig(data=["a.txt", "b.txt"], tokenizer="char")
    assert DataConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


# ------------------------------------------------------------------------------------- what mutation testing found
# (issue 21: each test below fails on a mutant of scratchlm/data/preparation.py that the suite let through)


def test_bpe_vocab_size_zero_is_refused():
    from scratchlm.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        DataConfig(tokenizer="bpe", vocab_size=0)
    assert info.value.field == "vocab_size"


def test_split_for_encoding_pieces_are_at_least_the_target_long():
    """Each piece but the last holds at least `target` characters: the cut is the first good
    newline at or after start + target (a cut searched from earlier makes many small pieces)."""
    text = "".join(f"line {i} of the text\n" for i in range(400))
    pieces = split_for_encoding(text, 100)
    assert "".join(pieces) == text and len(pieces) > 10
    assert all(len(p) >= 100 for p in pieces[:-1]) and all(len(p) < 100 + 30 for p in pieces[:-1])


def test_progress_bar_shows_only_when_asked(tmp_path, capfd):
    write_file(tmp_path / "t.txt", "some text to encode\n" * 50)
    prepare(DataConfig(data=str(tmp_path / "t.txt"), tokenizer="char"), tmp_path / "quiet", progress=False)
    assert "encoding" not in capfd.readouterr().err
    prepare(DataConfig(data=str(tmp_path / "t.txt"), tokenizer="char"), tmp_path / "shown", progress=True)
    assert "encoding" in capfd.readouterr().err


def test_a_split_of_exactly_one_window_is_enough_and_one_less_is_refused(tmp_path):
    """block_size + 1 tokens make one window (an input of block_size and its shifted target)."""
    write_file(tmp_path / "t.txt", "abcdefghij" * 10)  # BOS + 100 characters: 101 tokens
    cfg = dict(data=str(tmp_path / "t.txt"), tokenizer="char", val_fraction=0.0)
    prepare(DataConfig(**cfg, block_size=100), tmp_path / "fits", progress=False)  # 101 = 100 + 1: one window
    with pytest.raises(UserError) as info:
        prepare(DataConfig(**cfg, block_size=101), tmp_path / "short", progress=False)
    message = str(info.value)
    assert "the train split holds 101 tokens" in message and "102" in message
    assert "--val-fraction" not in message  # no validation split to shrink


def test_a_cached_folder_still_checks_the_validation_window(tmp_path):
    write_file(tmp_path / "t.txt", "abcdefghij" * 30)
    base = dict(data=str(tmp_path / "t.txt"), tokenizer="char", val_fraction=0.1)
    ensure_prepared(DataConfig(**base, block_size=8), tmp_path / "cache", progress=False)  # val: about 30 tokens
    with pytest.raises(UserError, match="the validation split holds"):
        ensure_prepared(DataConfig(**base, block_size=60), tmp_path / "cache", progress=False)  # the same cached folder


def test_document_counts_of_both_splits_by_hand(tmp_path):
    docs = ["aaaa", "bb", "cccccc", "d", "eeeee"]  # with BOS: 5, 3, 7, 2, 6 tokens; starts 0, 5, 8, 15, 17 of 23
    for i, d in enumerate(docs):
        write_file(tmp_path / "in" / f"{i}.txt", d)
    tail = read_meta(prepare(DataConfig(data=str(tmp_path / "in"), tokenizer="char", val_fraction=0.3),
                             tmp_path / "tail", progress=False))
    # n_train = int(23 * 0.7) = 16: the BOS at 0, 5, 8 and 15 lie in train, the one at 17 in validation
    assert (tail["train_documents"], tail["val_documents"]) == (4, 1)
    split = read_meta(prepare(DataConfig(data=str(tmp_path / "in"), tokenizer="char", val_fraction=0.1,
                                         split="documents"), tmp_path / "docs", progress=False))
    # round(5 * 0.1) = 0, but a validation split holds at least one document
    assert (split["train_documents"], split["val_documents"]) == (4, 1)


def test_prepared_folder_and_its_replacement_tokenizer(tmp_path):
    """The output folder gets the usual permissions (0777 less the umask, not mkdtemp's 0700), and
    preparing again into it replaces the tokenizer with the new data's."""
    import stat

    from scratchlm.fileio import umask

    write_file(tmp_path / "t.txt", "abc abc\n" * 20)
    out = prepare(DataConfig(data=str(tmp_path / "t.txt"), tokenizer="char"), tmp_path / "out", progress=False)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask()
    write_file(tmp_path / "t.txt", "xyz xyz\n" * 20)
    prepare(DataConfig(data=str(tmp_path / "t.txt"), tokenizer="char"), out, progress=False)
    assert load_tokenizer(out / "tokenizer").chars == sorted(set("xyz xyz\n"))


def test_cache_folder_is_named_after_the_data_file(tmp_path):
    from scratchlm.data.preparation import cache_dir

    write_file(tmp_path / "my_poems.txt", "a poem\n" * 10)
    folder = cache_dir(DataConfig(data=str(tmp_path / "my_poems.txt"), tokenizer="char"), tmp_path / "cache")
    assert folder.parent == tmp_path / "cache" and folder.name.startswith("my_poems-char-")


def test_without_a_block_size_two_tokens_make_a_split_and_one_does_not(tmp_path):
    """With no block size a split needs an input and its target: 2 tokens (BOS + 1 character)."""
    cfg = dict(tokenizer="char", val_fraction=0.0)
    write_file(tmp_path / "one.txt", "a")  # BOS + 1 character
    meta = read_meta(prepare(DataConfig(data=str(tmp_path / "one.txt"), **cfg), tmp_path / "fits", progress=False))
    assert meta["train_tokens"] == 2
    with pytest.raises(UserError, match=r"the train split holds 1 tokens, fewer than 2 tokens \(an input and its target\)"):
        prepare(DataConfig(data=str(tmp_path / "one.txt"), tokenizer="char", val_fraction=0.5), tmp_path / "short",
                progress=False)  # int(2 * 0.5) = 1 token for training


def test_tail_split_document_counts_at_the_cut_and_for_the_last_document(tmp_path):
    """A document whose BOS lies exactly on the cut belongs to validation; the last document
    counts for training when its BOS lies before the cut."""
    for i, d in enumerate(["aaaa", "b", "cc"]):  # with BOS: 5, 2, 3 tokens; starts 0, 5, 7 of 10
        write_file(tmp_path / "cut" / f"{i}.txt", d)
    meta = read_meta(prepare(DataConfig(data=str(tmp_path / "cut"), tokenizer="char", val_fraction=0.3),
                             tmp_path / "at-cut", progress=False))
    assert (meta["train_documents"], meta["val_documents"]) == (2, 1)  # n_train = int(10 * 0.7) = 7: BOS at 7 is val
    for i, d in enumerate(["aaaa", "bbbbbbb"]):  # 5 and 8 tokens; starts 0, 5 of 13
        write_file(tmp_path / "last" / f"{i}.txt", d)
    meta = read_meta(prepare(DataConfig(data=str(tmp_path / "last"), tokenizer="char", val_fraction=0.1),
                             tmp_path / "last-out", progress=False))
    assert (meta["train_documents"], meta["val_documents"]) == (2, 0)  # n_train = 11: both BOS in train


def test_preparing_into_an_empty_folder_and_after_a_killed_first_try(tmp_path):
    """An empty folder is taken; so is one that holds only what a prepare killed there left (its
    stale lock file, staging folder and a marker's temporary file), which the next prepare removes."""
    write_file(tmp_path / "t.txt", "abcdefghij" * 10)
    out = tmp_path / "out"
    out.mkdir()
    prepare(DataConfig(data=str(tmp_path / "t.txt"), tokenizer="char", val_fraction=0.1), out, progress=False)
    tokenizer = load_tokenizer(out / "tokenizer")
    assert tokenizer.decode(tokenizer.encode("jihgfedcba")) == "jihgfedcba"
    killed = tmp_path / "killed"
    (killed / ".staging-abc123" / "tokenizer").mkdir(parents=True)
    (killed / ".staging-abc123" / "train-00000.bin").write_bytes(b"half")
    (killed / ".staging-abc123" / "part-00001.bin.part").write_bytes(b"half")
    (killed / ".lock").write_text("999999\n")
    (killed / "..scratchlm-output.x1y2.tmp").write_text("scratchlm pre")  # its marker's write, cut short
    prepare(DataConfig(data=str(tmp_path / "t.txt"), tokenizer="char"), killed, progress=False)
    assert sorted(p.name for p in killed.iterdir()) == [".scratchlm-output", "meta.json", "tokenizer", "train-00000.bin", "val-00000.bin"]


# ------------------------------------------------------------------------------------- the sharded layout


def _nine_documents(folder: Path) -> list[list[int]]:
    """Nine .txt documents of 14 + 15 i char ids each with their BOS (666 in all); each one's ids,
    worked out here from the characters (the char tokenizer numbers the sorted alphabet, BOS next)."""
    docs = [f"doc {i}: " + "xyz. " * (3 * i + 1) + "\n" for i in range(9)]
    for i, d in enumerate(docs):
        write_file(folder / f"{i}.txt", d)
    alphabet = sorted(set("".join(docs)))
    return [[len(alphabet)] + [alphabet.index(c) for c in d] for d in docs]


def _cut_lengths(start: int, stop: int, size: int) -> list[int]:
    """Lengths of the stretch start..stop cut at every multiple of size (one empty length for an empty stretch)."""
    cuts = [start, *range((start // size + 1) * size, stop, size), stop]
    return [b - a for a, b in zip(cuts, cuts[1:])]


@pytest.mark.parametrize("shard_tokens", [50, 1])
@pytest.mark.parametrize("split", ["tail", "documents"])
def test_small_shards_hold_the_one_shard_stream_cut_at_every_shard_tokens(tmp_path, split, shard_tokens):
    """tail: the stream is cut at multiples of shard_tokens and at the split (so every train shard is
    full but the last, and the shard the split falls in gives the last train and the first val
    shard); documents: each split's own stream is cut at multiples of shard_tokens. Either way the
    shards joined are the one-shard output, and meta.json lists exactly the files written."""
    ids = _nine_documents(tmp_path / "in")
    stream = [t for d in ids for t in d]
    assert len(stream) == 666
    cfg = DataConfig(data=str(tmp_path / "in"), tokenizer="char", split=split, seed=3,
                     val_fraction=0.1 if split == "tail" else 0.3)
    small = prepare(cfg, tmp_path / "small", progress=False, shard_tokens=shard_tokens)
    whole = prepare(cfg, tmp_path / "whole", progress=False, shard_tokens=10**6)
    if split == "tail":  # n_train = int(666 * 0.9) = 599, not a multiple of 50: the cut falls inside a shard
        want = {"train": stream[:599], "val": stream[599:]}
        lengths = {"train": _cut_lengths(0, 599, shard_tokens), "val": _cut_lengths(599, 666, shard_tokens)}
    else:  # round(9 * 0.3) = 3 documents, the first 3 of the seed's permutation
        held = set(np.random.default_rng(3).permutation(9)[:3].tolist())
        want = {"train": [t for i, d in enumerate(ids) if i not in held for t in d],
                "val": [t for i, d in enumerate(ids) if i in held for t in d]}
        lengths = {s: _cut_lengths(0, len(want[s]), shard_tokens) for s in want}
    if shard_tokens == 50:
        assert lengths["train"][:-1] == [50] * (len(lengths["train"]) - 1) and 0 < lengths["train"][-1] < 50
    meta, whole_meta = read_meta(small), read_meta(whole)
    bos = ids[0][0]
    for s in ("train", "val"):
        listed = meta["shards"][s]
        assert [e["file"] for e in listed] == [f"{s}-{k:05d}.bin" for k in range(len(lengths[s]))]
        assert [e["tokens"] for e in listed] == lengths[s]
        files = [read_shard(small / e["file"]) for e in listed]
        assert [len(f) for f in files] == lengths[s]
        assert np.concatenate(files).tolist() == want[s] == read_split(whole, s).tolist() == read_split(small, s).tolist()
        assert whole_meta["shards"][s] == [{"file": f"{s}-00000.bin", "tokens": len(want[s])}]
        assert meta[f"{s}_tokens"] == whole_meta[f"{s}_tokens"] == len(want[s])
        # every character is ASCII: one byte per id that is not a BOS
        assert meta[f"{s}_bytes"] == whole_meta[f"{s}_bytes"] == sum(t != bos for t in want[s])
    written = sorted(p.name for p in small.iterdir() if p.suffix == ".bin")
    assert written == sorted(e["file"] for s in ("train", "val") for e in meta["shards"][s])
    assert meta["shard_tokens"] == shard_tokens and not [p for p in small.iterdir() if p.name.startswith(".staging")]


@pytest.mark.parametrize("split", ["tail", "documents"])
def test_an_empty_validation_split_is_one_empty_shard(tmp_path, split):
    ids = _nine_documents(tmp_path / "in")
    out = prepare(DataConfig(data=str(tmp_path / "in"), tokenizer="char", split=split, val_fraction=0.0),
                  tmp_path / "out", progress=False, shard_tokens=50)
    meta = read_meta(out)
    assert meta["shards"]["val"] == [{"file": "val-00000.bin", "tokens": 0}]
    assert len(read_shard(out / "val-00000.bin")) == 0 == len(read_split(out, "val"))
    assert [e["tokens"] for e in meta["shards"]["train"]] == [50] * 13 + [16]  # 666 = 13 * 50 + 16
    assert read_split(out, "train").tolist() == [t for d in ids for t in d]


def test_preparing_again_with_fewer_shards_leaves_none_of_the_old_ones(tmp_path):
    ids = _nine_documents(tmp_path / "in")
    cfg = DataConfig(data=str(tmp_path / "in"), tokenizer="char")
    out = prepare(cfg, tmp_path / "out", progress=False, shard_tokens=50)
    assert (out / "train-00011.bin").is_file() and (out / "val-00002.bin").is_file()
    prepare(cfg, out, progress=False, shard_tokens=10**6)
    assert sorted(p.name for p in out.iterdir()) == [".scratchlm-output", "meta.json", "tokenizer", "train-00000.bin",
                                                     "val-00000.bin"]
    assert read_split(out, "train").tolist() + read_split(out, "val").tolist() == [t for d in ids for t in d]
    assert is_prepared(out)


def test_a_folder_of_the_one_file_layout_is_read_and_then_replaced(tmp_path):
    """A folder from before shards (train.bin, val.bin, a meta.json without "shards") is read by
    read_split and is_prepared; prepare takes it as its own and leaves only the shard layout."""
    from scratchlm.data import FORMAT_VERSION, write_shard
    from scratchlm.text.tokenizer import CharTokenizer

    old = tmp_path / "old"
    old.mkdir()
    train_ids = [i % 7 for i in range(40)]
    write_shard(old / "train.bin", train_ids, dtype="uint16")
    write_shard(old / "val.bin", [6, 5, 4, 3], dtype="uint16")
    CharTokenizer("abcdef ").save(old / "tokenizer")
    meta = {"format_version": FORMAT_VERSION, "tokenizer": "char", "dtype": "uint16", "train_tokens": 40, "val_tokens": 4}
    (old / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    assert read_split(old, "train").tolist() == train_ids and read_split(old, "val").tolist() == [6, 5, 4, 3]
    assert is_prepared(old)
    (old / "meta.json").write_text(json.dumps({**meta, "val_tokens": 5}), encoding="utf-8")
    with pytest.raises(UserError, match="val.bin: holds 4 ids, but meta.json says 5"):
        read_split(old, "val")
    assert not is_prepared(old)
    (old / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    ids = _nine_documents(tmp_path / "in")
    prepare(DataConfig(data=str(tmp_path / "in"), tokenizer="char"), old, progress=False)
    assert sorted(p.name for p in old.iterdir()) == [".scratchlm-output", "meta.json", "tokenizer", "train-00000.bin",
                                                     "val-00000.bin"]
    assert read_split(old, "train").tolist() + read_split(old, "val").tolist() == [t for d in ids for t in d]


def test_sharded_tokens_over_shard_files_read_across_their_boundaries(tmp_path):
    from scratchlm.data import BatchStream, ShardedTokens, write_shard

    parts = [np.arange(0, 7), np.arange(0), np.arange(200, 203), np.arange(300, 311)]
    tokens = ShardedTokens([read_shard(write_shard(tmp_path / f"s{i}.bin", p, dtype="uint16")) for i, p in enumerate(parts)])
    whole = np.concatenate(parts).astype(np.uint16)
    assert len(tokens) == 21 and tokens.shape == (21,)
    assert np.asarray(tokens).tolist() == whole.tolist() == tokens.tolist() and np.asarray(tokens).dtype == np.uint16
    assert tokens[5:12].tolist() == whole[5:12].tolist()  # over the empty shard and the whole 3-id one
    positions = np.array([[6, 7, 9, 10], [-1, 0, 20, 8]])
    assert tokens[positions].tolist() == whole[positions].tolist() and tokens[7] == whole[7] == 200
    for mode in ("random", "sequential"):
        x, y = BatchStream(tokens, 3, 5, seed=2, mode=mode).next_batch()
        want_x, want_y = BatchStream(whole, 3, 5, seed=2, mode=mode).next_batch()
        assert x.tolist() == want_x.tolist() and y.tolist() == want_y.tolist()


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=5), data=st.data())
def test_sharded_tokens_index_as_the_joined_shards_do(lengths, data):
    from scratchlm.data import ShardedTokens

    rng = np.random.default_rng(sum(lengths))
    shards = [rng.integers(0, 60_000, size=n).astype(np.uint16) for n in lengths]
    whole, tokens = np.concatenate(shards), ShardedTokens(shards)
    n = len(whole)
    assert len(tokens) == n and np.asarray(tokens).tolist() == whole.tolist() == tokens.tolist()
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    cut = slice(data.draw(bound), data.draw(bound), data.draw(st.sampled_from([None, 1, 2, 3, -1, -2])))
    assert tokens[cut].tolist() == whole[cut].tolist() and tokens[cut].dtype == np.uint16, cut
    if n:
        shape = data.draw(st.sampled_from([(), (4,), (2, 3)]))
        positions = np.asarray(data.draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(shape)),
                                                  max_size=int(np.prod(shape)))), dtype=np.int64).reshape(shape)
        assert np.array_equal(tokens[positions], whole[positions]) and np.shape(tokens[positions]) == shape
    for outside in (n, -n - 1):
        with pytest.raises(IndexError):
            tokens[outside]
