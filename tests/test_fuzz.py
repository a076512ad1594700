"""Fuzzing with hypothesis: tokenizer round trips, the shard header parser, the config parsers and
the `scratchlm train` flag parser. Each property states its budget (max_examples); the file runs
in well under 30 s.

The contract under test: valid input gives correct output; anything else raises UserError (or its
subclass ConfigError) with a message, never another exception.
"""

from __future__ import annotations

import contextlib
import io
import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scratchlm.data import DTYPES, HEADER, MAGIC, read_shard, write_shard
from scratchlm.errors import UserError
from scratchlm.model.config import GPTConfig
from scratchlm.text.tokenizer import BPETokenizer, CharTokenizer, GPT2Tokenizer
from scratchlm.training.train_config import TrainConfig, cli_fields

from conftest import SHARED_DATA, shared_file

GPT2_RANKS = SHARED_DATA / "gpt2" / "gpt2.tiktoken"
FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Any text hypothesis can make (every Unicode plane, no lone surrogates: those are not text in UTF-8),
# weighted towards the pieces tokenizers trip on: whitespace runs, special-token look-alikes, emoji.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200) | st.lists(
    st.sampled_from(["<|endoftext|>", "<|bos|>", "<|eos|>", " ", "  ", "\n\n", "\t", "'s", "\u00e9", "e\u0301",
                     "\U0001f600", "\u4e2d\u6587", "\r\n", "\x00", "ab", "  x"]), max_size=30).map("".join)


# ------------------------------------------------------------------------------------------ tokenizers


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    sample = ["the king speaks to the queen, and the queen answers.", "caf\u00e9 \u4e2d\u6587 \U0001f600 tabs\tand\nlines"] * 20
    return BPETokenizer.train(sample, vocab_size=400)


@settings(max_examples=300, **FUZZ)
@given(text=TEXT)
def test_bpe_round_trip_and_both_encoders_agree(bpe, text):
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert ids == bpe.encode_reference(text)  # the tiktoken twin against the Hugging Face tokenizer
    assert all(0 <= i < bpe.vocab_size for i in ids)


@settings(max_examples=300, **FUZZ)
@given(alphabet=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),
       data=st.data())
def test_char_round_trip_and_unknown_characters(alphabet, data):
    tok = CharTokenizer.train([alphabet])
    text = data.draw(st.text(st.sampled_from(sorted(set(alphabet))), max_size=100))
    assert tok.decode(tok.encode(text)) == text
    other = data.draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=20))
    if set(other) <= set(alphabet):
        assert tok.decode(tok.encode(other)) == other
    else:
        with pytest.raises(UserError):
            tok.encode(other)


@pytest.fixture(scope="module")
def gpt2() -> GPT2Tokenizer:
    return GPT2Tokenizer.from_rank_file(shared_file("gpt2/gpt2.tiktoken"))


@settings(max_examples=300, **FUZZ)
@given(text=TEXT)
def test_gpt2_round_trip(gpt2, text):
    ids = gpt2.encode(text)
    assert gpt2.decode(ids) == text
    assert all(0 <= i < gpt2.vocab_size for i in ids)


# ------------------------------------------------------------------------------------------ shards


def _independent_parse(raw: bytes) -> np.ndarray | None:
    """What a correct reader must return for these bytes, or None where it must refuse."""
    if len(raw) < 24:
        return None
    magic, version, itemsize, count = struct.unpack("<8sIIQ", raw[:24])
    if magic != b"SLMTOKEN" or version != 1 or itemsize not in (2, 4) or len(raw) != 24 + count * itemsize:
        return None
    return np.frombuffer(raw[24:], dtype="<u2" if itemsize == 2 else "<u4")


SHARD_EDITS = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10_000)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 7)), min_size=1, max_size=4)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=9)),
    st.tuples(st.just("header"), st.tuples(st.just(MAGIC) | st.binary(min_size=8, max_size=8), st.integers(0, 2**32 - 1),
                                          st.sampled_from([0, 1, 2, 3, 4, 8, 2**31]), st.integers(0, 2**64 - 1))),
    st.tuples(st.just("random"), st.binary(max_size=64)),
)


@settings(max_examples=400, **FUZZ)
@given(tokens=st.lists(st.integers(0, 2**32 - 1), max_size=60), wide=st.booleans(), edit=SHARD_EDITS)
def test_read_shard_returns_the_right_ids_or_a_user_error(tmp_path_factory, tokens, wide, edit):
    if not wide:
        tokens = [t % 2**16 for t in tokens]
    path = tmp_path_factory.mktemp("shard") / "s.bin"
    write_shard(path, np.array(tokens, dtype=np.int64), DTYPES[4 if wide else 2])
    raw = bytearray(path.read_bytes())
    kind, arg = edit
    if kind == "truncate":
        raw = raw[: arg % (len(raw) + 1)]
    elif kind == "flip":
        for pos, bit in arg:
            raw[pos % len(raw)] ^= 1 << bit
    elif kind == "append":
        raw += arg
    elif kind == "header":
        magic, version, itemsize, count = arg
        raw[:24] = HEADER.pack(magic, version % 3, itemsize, count)
    else:
        raw = bytearray(arg)
    path.write_bytes(bytes(raw))
    expected = _independent_parse(bytes(raw))
    try:
        got = read_shard(path)
    except UserError as exc:
        assert expected is None, f"refused a valid shard: {exc}"
        assert str(path) in str(exc)
        return
    assert expected is not None, "accepted a shard a correct reader refuses"
    assert np.array_equal(np.asarray(got), expected)


# ------------------------------------------------------------------------------------------ configs

ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 2000), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["learned", "rope", "relu", "swiglu", "rmsnorm", "post", "gpt2", "cosine", "bfloat16", "auto"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _config_dicts(fields: list[str], valid: dict) -> st.SearchStrategy:
    """A valid config with some fields replaced by anything, and sometimes an unknown field added."""
    changes = st.dictionaries(st.sampled_from(fields), ANY_VALUE, max_size=4)
    extra = st.dictionaries(st.text(min_size=1, max_size=8), ANY_VALUE, max_size=1)
    return st.tuples(changes, extra).map(lambda ce: {**valid, **ce[0], **ce[1]})


GPT_FIELDS = list(GPTConfig.__dataclass_fields__)
SMALL_GPT = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)


@settings(max_examples=500, **FUZZ)
@given(values=_config_dicts(GPT_FIELDS, SMALL_GPT))
def test_gpt_config_from_dict_is_valid_or_a_config_error(values):
    try:
        cfg = GPTConfig.from_dict(values)
    except UserError as exc:
        assert str(exc) and values != SMALL_GPT, exc  # the unchanged config must be accepted
        return
    # accepted: every size a positive whole number, the heads divide the width, and it round-trips
    for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
        value = getattr(cfg, name)
        assert type(value) is int and value > 0, name
    assert cfg.n_embd % cfg.n_head == 0
    assert 0 <= cfg.dropout < 1 and cfg.norm_eps > 0 and math.isfinite(cfg.dropout)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg


TRAIN_FIELDS = [f for f in TrainConfig.__dataclass_fields__ if f not in ("model_overrides",)]


@settings(max_examples=500, **FUZZ)
@given(values=_config_dicts(TRAIN_FIELDS, {}))
def test_train_config_from_dict_is_valid_or_a_config_error(values):
    try:
        cfg = TrainConfig.from_dict(values)
    except UserError as exc:
        assert str(exc) and values != {}, exc  # the defaults must be accepted
        return
    assert cfg.lr > 0 and cfg.min_lr >= 0 and 0 < cfg.val_fraction < 1 and cfg.max_steps > 0
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def _flag_values(kind: str) -> st.SearchStrategy:
    typed = {"int": st.integers(-5, 300).map(str), "float": st.floats(allow_nan=True).map(repr),
             "str": st.sampled_from(["auto", "cpu", "cosine", "rope", "gelu", "float16", "char", "x"])}
    return typed.get(kind, st.nothing()) | st.sampled_from(["none", "", "-1", "0", "1e999", "nan", "abc", "3.5", "-", "--"])


CLI_FIELDS = [f for f in cli_fields() if f.kind != "bool"]
FLAGS = st.lists(st.sampled_from(CLI_FIELDS).flatmap(
    lambda f: st.tuples(st.sampled_from([f"--{f.name}", f"--{f.name.replace('_', '-')}"]), _flag_values(f.kind))),
    max_size=5)


@settings(max_examples=150, **FUZZ)
@given(flags=FLAGS, preset=st.sampled_from([[], ["--preset", "smoke"], ["--preset", "gpt2-124m"]]))
def test_train_flag_parser_gives_a_config_or_one_error_line(flags, preset):
    from scratchlm.cli.main import main

    argv = ["train", *preset, *[part for flag, value in flags for part in (flag, value)], "--show-config"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a value of the wrong type
            code = exc.code
    assert code == 0 or flags, err.getvalue()  # a preset alone is a valid config
    if code == 0:
        assert out.getvalue().lstrip().startswith("{")
    else:
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, err.getvalue())
