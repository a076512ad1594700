"""The chat template's special tokens added to each tokenizer kind (`with_tokens`): every id the
tokenizer had keeps its piece, the new ones follow at the next free ids, text that spells a token
stays characters, and a saved tokenizer reads back the same. The ids are judged by Hugging Face's
own tokenizers (transformers' add_special_tokens appends at the end of the vocabulary the same way)
and by hand for the char kind."""

from __future__ import annotations

import json

import pytest

from conftest import shared_file
from scratchlm.errors import UserError
from scratchlm.text.chat import CHAT_TOKENS
from scratchlm.text.tokenizer import GPT2Tokenizer, CharTokenizer, load_tokenizer, train_tokenizer

POEM = "床前看月光，疑是地上霜。举头望山月，低头思故乡。"
TEXT = "Spelled out: <|user|> and <|end|>, then " + POEM


def _bpe():
    return train_tokenizer("bpe", [TEXT * 20, "hello world, the king's men\n" * 30], 320)


def _gpt2():
    return GPT2Tokenizer.from_rank_file(shared_file("gpt2/gpt2.tiktoken"))


def _kinds():
    return [pytest.param(lambda: CharTokenizer.train([TEXT]), id="char"), pytest.param(_bpe, id="bpe"),
            pytest.param(_gpt2, id="gpt2")]


@pytest.mark.parametrize("make", _kinds())
def test_the_chat_tokens_follow_the_vocabulary_and_every_old_id_keeps_its_piece(make, tmp_path):
    tok = make()
    grown = tok.with_tokens(CHAT_TOKENS)
    n = tok.vocab_size
    assert grown.vocab_size == n + 4
    assert [grown.specials[t] for t in CHAT_TOKENS] == [n, n + 1, n + 2, n + 3]
    assert all(grown.decode([i]) == tok.decode([i]) for i in range(n))
    assert (grown.bos_id, grown.eos_id) == (tok.bos_id, tok.eos_id)
    assert grown.special_ids == tok.special_ids | {n, n + 1, n + 2, n + 3}
    # text is literal: the spelling of a chat token is characters, with the ids it had before
    assert grown.encode(TEXT) == tok.encode(TEXT)
    assert not set(grown.encode(TEXT)) & set(range(n, n + 4))
    assert grown.decode([n + 1]) == "<|user|>"
    # the new ids stand for no bytes of text (bits per byte and the pieces' view count none)
    assert list(grown.token_byte_lengths()[n:]) == [0, 0, 0, 0]
    assert grown.with_tokens(CHAT_TOKENS) is grown  # nothing to add: the same tokenizer
    grown.save(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert back.specials == grown.specials and back.vocab_size == grown.vocab_size
    assert back.encode(TEXT) == tok.encode(TEXT)


def test_a_char_vocabulary_gains_the_fine_tuning_datas_characters_before_the_tokens():
    tok = CharTokenizer.train([POEM])
    n = tok.vocab_size
    grown = tok.with_tokens(CHAT_TOKENS, chars="《静夜思》床")  # 思 and 床 it has; the rest in code point order
    new_chars = ["《", "》", "夜", "静"]
    assert [ord(c) for c in new_chars] == sorted(ord(c) for c in new_chars)
    assert [grown.encode(c)[0] for c in new_chars] == list(range(n, n + 4))
    assert [grown.specials[t] for t in CHAT_TOKENS] == list(range(n + 4, n + 8))
    assert grown.encode(POEM) == tok.encode(POEM)


def test_a_char_tokenizers_chat_tokens_are_transformers_special_tokens_after_export(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from scratchlm.text.hf_char_tokenizer import char_tokenizer_for_hf

    tok = CharTokenizer.train([TEXT]).with_tokens(CHAT_TOKENS)
    char_tokenizer_for_hf(tok).save(str(tmp_path / "tokenizer.json"))
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert [hf.convert_tokens_to_ids(t) for t in CHAT_TOKENS] == [tok.specials[t] for t in CHAT_TOKENS]
    assert hf.decode([tok.specials["<|end|>"]], skip_special_tokens=True) == ""


def test_a_bpe_tokenizers_chat_tokens_take_the_ids_transformers_gives_them(tmp_path):
    from transformers import PreTrainedTokenizerFast

    tok = _bpe()
    tok.save(tmp_path / "before")
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "before" / "tokenizer.json"))
    hf.add_special_tokens({"additional_special_tokens": list(CHAT_TOKENS)})
    grown = tok.with_tokens(CHAT_TOKENS)
    assert [hf.convert_tokens_to_ids(t) for t in CHAT_TOKENS] == [grown.specials[t] for t in CHAT_TOKENS]
    grown.save(tmp_path / "after")
    hf_after = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "after" / "tokenizer.json"))
    assert hf_after.convert_tokens_to_ids("<|assistant|>") == grown.specials["<|assistant|>"]
    assert hf_after.decode([grown.specials["<|user|>"], *grown.encode("hi")], skip_special_tokens=True) == "hi"


def test_gpt2s_chat_tokens_take_the_ids_transformers_gives_them():
    from transformers import GPT2TokenizerFast

    folder = shared_file("gpt2/vocab.json").parent
    hf = GPT2TokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    assert len(hf) == 50257
    hf.add_special_tokens({"additional_special_tokens": list(CHAT_TOKENS)})
    grown = _gpt2().with_tokens(CHAT_TOKENS)
    assert [hf.convert_tokens_to_ids(t) for t in CHAT_TOKENS] == [grown.specials[t] for t in CHAT_TOKENS]
    assert len(hf) == grown.vocab_size == 50261
    assert grown.encode("Hello <|user|>") == hf("Hello <|user|>", split_special_tokens=True)["input_ids"]


def test_a_saved_gpt2_tokenizer_with_malformed_added_tokens_is_refused(tmp_path):
    grown = _gpt2().with_tokens(CHAT_TOKENS)
    grown.save(tmp_path / "tok")
    config_path = tmp_path / "tok" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for bad in ({"<|user|>": 50300}, {"plain": 50257}, {"<|endoftext|>": 50257}, ["<|user|>"], {"<|user|>": True}):
        config["added"] = bad
        config_path.write_text(json.dumps(config))
        with pytest.raises(UserError, match="added"):
            load_tokenizer(tmp_path / "tok")


def test_a_char_piece_that_is_neither_a_character_nor_a_special_spelling_is_refused():
    tok = CharTokenizer.train(["ab"])
    with pytest.raises(UserError, match="neither one character"):
        CharTokenizer.from_ids({**tok.piece_ids(), "<|Not Special|>": tok.vocab_size})
    with pytest.raises(UserError, match="neither one character"):
        tok.with_tokens(["word"])
