"""Tokenizers: char by hand, bpe against Hugging Face's own encoder, gpt2 against a second
implementation (Hugging Face's ByteLevelBPETokenizer over vocab.json/merges.txt)."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scratchlm.errors import UserError
from scratchlm.text.tokenizer import (
    BOS,
    EOS,
    BPETokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    UnknownCharactersError,
    byte_alphabet,
    get_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

from conftest import SHARED_DATA, needs_shared

DATA = SHARED_DATA
GPT2_DIR = DATA / "gpt2"
needs_gpt2 = needs_shared("gpt2")
needs_tiny = needs_shared("tinyshakespeare.txt")

SMALL_TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\n"
    "中文也可以：你好，世界！ Ünïcödé — naïve café, 🎭 drama.\n"
) * 40

unicode_text = st.text(max_size=200)  # any code point except surrogates (which UTF-8 cannot hold)


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return train_tokenizer("bpe", [SMALL_TEXT], vocab_size=300)


@pytest.fixture(scope="module")
def gpt2() -> GPT2Tokenizer:
    return get_tokenizer("gpt2", tokenizer_file=GPT2_DIR / "gpt2.tiktoken")


# ------------------------------------------------------------------------------------------ char


def test_char_vocabulary_is_sorted_characters_then_specials():
    text = "hello, world"
    tok = train_tokenizer("char", [text])
    alphabet = sorted(set(text))  # [' ', ',', 'd', 'e', 'h', 'l', 'o', 'r', 'w']
    assert tok.vocab_size == len(alphabet) + 2
    assert (tok.bos_id, tok.eos_id) == (len(alphabet), len(alphabet) + 1)
    assert tok.encode("hello") == [alphabet.index(c) for c in "hello"] == [4, 3, 5, 5, 6]
    assert tok.decode([tok.bos_id]) == BOS


def test_char_unknown_characters_are_named():
    tok = train_tokenizer("char", ["abc"])
    with pytest.raises(UnknownCharactersError) as info:
        tok.encode("abxyzx")
    assert isinstance(info.value, UserError)
    assert info.value.characters == ["x", "y", "z"]
    assert "'x'" in str(info.value) and "'z'" in str(info.value)


def test_char_unk_id_when_asked_for():
    tok = train_tokenizer("char", ["abc"], unk=True)
    assert tok.vocab_size == 6 and tok.unk_id == 5
    assert tok.encode("axb") == [0, 5, 1]


@settings(max_examples=60, deadline=None)
@given(alphabet=st.text(min_size=1, max_size=30), data=st.data())
def test_char_round_trip_over_its_alphabet(alphabet, data):
    tok = CharTokenizer(alphabet)
    s = data.draw(st.text(alphabet=sorted(set(alphabet)), max_size=100))
    assert tok.decode(tok.encode(s)) == s
    assert tok.token_byte_lengths()[tok.encode(s)].sum() == len(s.encode("utf-8"))


def test_char_save_load(tmp_path):
    tok = train_tokenizer("char", [SMALL_TEXT], unk=True)
    tok.save(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert back.kind == "char" and back.vocab_size == tok.vocab_size and back.unk_id == tok.unk_id
    assert back.encode(SMALL_TEXT) == tok.encode(SMALL_TEXT)


# ------------------------------------------------------------------------------------------ bpe


def test_bpe_sizes_and_specials(bpe):
    assert bpe.vocab_size == 300
    assert {bpe.bos_id, bpe.eos_id} == {bpe._tok.token_to_id(BOS), bpe._tok.token_to_id(EOS)}
    assert bpe._fast is not None  # a trained tokenizer gets the tiktoken fast path


def test_bpe_vocab_smaller_than_byte_alphabet_is_an_error():
    with pytest.raises(UserError, match="byte alphabet"):
        train_tokenizer("bpe", [SMALL_TEXT], vocab_size=200)


def test_bpe_special_spelling_in_text_is_plain_text(bpe):
    ids = bpe.encode(f"a {EOS} b {BOS}")
    assert bpe.eos_id not in ids and bpe.bos_id not in ids
    assert bpe.decode(ids) == f"a {EOS} b {BOS}"


@settings(max_examples=150, deadline=None)
@given(s=unicode_text)
def test_bpe_round_trip_any_unicode(bpe, s):
    ids = bpe.encode(s)
    assert bpe.decode(ids) == s
    # the fast (tiktoken) path and Hugging Face's encoder are two implementations of one tokenizer
    assert ids == bpe.encode_reference(s)
    assert bpe.token_byte_lengths()[ids].sum() == len(s.encode("utf-8"))


@needs_tiny
def test_bpe_fast_path_matches_hugging_face_on_real_text():
    text = (DATA / "tinyshakespeare.txt").read_text(encoding="utf-8")
    tok = train_tokenizer("bpe", [text[:300_000]], vocab_size=2000)
    held_out = text[300_000:600_000]
    assert tok.encode(held_out) == tok.encode_reference(held_out)
    assert tok.encode_batch([held_out[:1000], held_out[1000:5000]]) == [
        tok.encode_reference(held_out[:1000]), tok.encode_reference(held_out[1000:5000])]


def test_byte_alphabet_is_the_one_hugging_face_byte_level_uses():
    """Checked against the `tokenizers` library: the same 256 characters, and its byte-level
    pre-tokenizer spells every byte valid UTF-8 can hold as byte_alphabet does."""
    from tokenizers import pre_tokenizers

    alphabet = byte_alphabet()
    assert sorted(alphabet) == list(range(256))
    assert set(alphabet.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    text = "".join(map(chr, [*range(256), 0x3b1, 0x4e2d, 0x1f600]))  # lead bytes of 2, 3 and 4 byte forms too
    spelled = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)
    assert spelled[0][0] == "".join(alphabet[b] for b in text.encode("utf-8"))
    assert (alphabet[ord(" ")], alphabet[ord("\n")], alphabet[ord("A")]) == ("Ġ", "Ċ", "A")  # as GPT-2's vocab.json


def test_bpe_save_load(tmp_path, bpe):
    bpe.save(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert back.kind == "bpe" and back.vocab_size == bpe.vocab_size
    assert (back.bos_id, back.eos_id) == (bpe.bos_id, bpe.eos_id)
    assert back.encode(SMALL_TEXT) == bpe.encode(SMALL_TEXT)
    # a bare tokenizer.json is accepted too
    assert get_tokenizer("bpe", tokenizer_file=tmp_path / "tok" / "tokenizer.json").encode("speak") == bpe.encode("speak")


# ------------------------------------------------------------------------------------------ gpt2


@needs_gpt2
def test_gpt2_known_ids(gpt2):
    assert gpt2.vocab_size == 50257 and gpt2.bos_id == gpt2.eos_id == 50256
    assert gpt2.encode("Hello world") == [15496, 995]  # the ids GPT-2's papers and docs show
    assert gpt2.decode([50256]) == EOS


@needs_gpt2
@needs_tiny
def test_gpt2_matches_hugging_face_byte_level_bpe():
    from tokenizers import ByteLevelBPETokenizer

    hf = ByteLevelBPETokenizer(str(GPT2_DIR / "vocab.json"), str(GPT2_DIR / "merges.txt"))
    tok = get_tokenizer("gpt2", tokenizer_file=GPT2_DIR / "gpt2.tiktoken")
    text = (DATA / "tinyshakespeare.txt").read_text(encoding="utf-8")[:300_000]
    expected = hf.encode(text).ids
    assert len(expected) > 50_000
    assert tok.encode(text) == expected
    pieces = [text[i : i + 7000] for i in range(0, 70_000, 7000)]
    assert tok.encode_batch(pieces) == [e.ids for e in hf.encode_batch(pieces)]


@needs_gpt2
@settings(max_examples=150, deadline=None)
@given(s=unicode_text)
def test_gpt2_round_trip_any_unicode(gpt2, s):
    ids = gpt2.encode(s)
    assert gpt2.decode(ids) == s
    assert gpt2.token_byte_lengths()[ids].sum() == len(s.encode("utf-8"))


@needs_gpt2
def test_gpt2_save_is_self_contained(tmp_path, gpt2):
    shutil.copyfile(GPT2_DIR / "gpt2.tiktoken", tmp_path / "ranks.tiktoken")
    tok = get_tokenizer("gpt2", tokenizer_file=tmp_path / "ranks.tiktoken")
    tok.save(tmp_path / "run" / "tokenizer")
    (tmp_path / "ranks.tiktoken").unlink()  # the saved directory must not point back at it
    back = load_tokenizer(tmp_path / "run" / "tokenizer")
    assert back.kind == "gpt2"
    assert back.encode("To be, or not to be") == gpt2.encode("To be, or not to be")


def test_gpt2_without_network_asks_for_a_file(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(UserError, match="--tokenizer-file"):
        get_tokenizer("gpt2")


def test_bad_rank_file_and_kind(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not base64 at all\n")
    with pytest.raises(UserError, match="bad.tiktoken"):
        get_tokenizer("gpt2", tokenizer_file=bad)
    with pytest.raises(UserError, match="unknown tokenizer"):
        train_tokenizer("wordpiece", ["x"])
    with pytest.raises(UserError, match="no saved tokenizer"):
        load_tokenizer(tmp_path)


# ------------------------------------------------------------------------------------------ char ids from a file


def test_char_from_ids_keeps_every_id_as_given(tmp_path):
    """Ids in any order, with gaps: encoding, decoding, byte lengths and save/load keep them."""
    ids = {"b": 4, BOS: 0, "a": 2, EOS: 7, "é": 5, "<unk>": 1}  # 3 and 6 hold nothing
    tok = CharTokenizer.from_ids(ids, "<unk>")
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.unk_id) == (8, 0, 7, 1)
    assert tok.encode("abéz") == [2, 4, 5, 1]
    assert tok.decode([0, 2, 3, 6, 5, 7]) == BOS + "aé" + EOS  # the gaps decode to nothing
    assert tok.special_ids == {0, 1, 7}
    assert tok.token_byte_lengths().tolist() == [0, 0, 1, 0, 1, 2, 0, 0]
    tok.save(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert back.piece_ids() == ids and back.unk_id == 1 and back.encode("abéz") == [2, 4, 5, 1]


def test_char_built_from_text_saves_the_compact_form_as_before(tmp_path):
    import json

    train_tokenizer("char", ["cab"], unk=True).save(tmp_path / "tok")
    assert json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text()) == {"kind": "char", "chars": "abc",
                                                                                   "unk": True}


@pytest.mark.parametrize("ids, unk, words", [
    ({"a": 0, "ab": 1, BOS: 2, EOS: 3}, None, "'ab'"),
    ({"a": 0, "b": 0, BOS: 2, EOS: 3}, None, "id 0"),
    ({"a": 0, BOS: 2}, None, EOS),
    ({"a": -1, BOS: 2, EOS: 3}, None, "-1"),
    ({"a": 0, BOS: 2, EOS: 10**9}, None, "ids run to"),
    ({"a": 0, BOS: 2, EOS: 3}, "?", "'?'"),
])
def test_char_from_ids_refuses_what_it_cannot_hold(ids, unk, words):
    with pytest.raises(UserError, match=words.replace("|", r"\|")):
        CharTokenizer.from_ids(ids, unk)


def test_a_char_config_with_bad_pieces_is_one_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"kind": "char", "pieces": ["a", 5]}')
    with pytest.raises(UserError, match="pieces"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"kind": "char", "pieces": ["a", "a", "<|bos|>", "<|endoftext|>"]}')
    with pytest.raises(UserError, match="twice"):
        load_tokenizer(tmp_path)
