"""The fine-tuning stage's data (scratchlm/training/sft_data.py): a char base vocabulary gains the
conversations' new characters and the chat tokens, each row is the template's rendering written out
here by hand from the tokenizer's own encode, the held-out conversations are apart from the training
ones, and the bytes per target are counted by hand."""

from __future__ import annotations

import json

import pytest

from scratchlm.errors import UserError
from scratchlm.text.chat import CHAT_TOKENS
from scratchlm.text.tokenizer import CharTokenizer
from scratchlm.training.sft_data import fine_tuning_data

BASE = CharTokenizer.train(["床前看月光，疑是地上霜。举头望山月，低头思故乡。"])
REQUESTS = ["写一首诗。", "题为《月》。", "再写一首。", "写《霜》。", "写山。"]
REPLIES = ["床前月光。", "山月霜。", "低头思乡。", "地上霜。", "举头望山。"]


def _file(tmp_path, n=5):
    path = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in zip(REQUESTS[:n], REPLIES[:n])]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    return path


def test_rows_are_the_template_by_hand_and_the_held_out_ones_are_apart(tmp_path):
    data = fine_tuning_data(_file(tmp_path), BASE, block_size=64, val_fraction=0.2, seed=3)
    tok = data.tokenizer
    new_chars = sorted(set("".join(REQUESTS + REPLIES)) - set(BASE.chars))
    assert new_chars and all(len(tok.encode(c)) == 1 for c in new_chars)
    assert data.added_ids == list(range(BASE.vocab_size, BASE.vocab_size + len(new_chars) + 4))
    assert [tok.specials[t] for t in CHAT_TOKENS] == data.added_ids[-4:]
    user, assistant, end = (tok.specials[t] for t in ("<|user|>", "<|assistant|>", "<|end|>"))
    by_hand = [[tok.bos_id, user, *tok.encode(q), end, assistant, *tok.encode(a), end] for q, a in zip(REQUESTS, REPLIES)]
    got = [r.ids for r in data.train_rows + data.val_rows]
    assert len(data.val_rows) == 1 and len(data.train_rows) == 4
    assert sorted(got) == sorted(by_hand)  # every conversation once, in one part or the other
    (val,) = data.val_rows
    reply = REPLIES[by_hand.index(val.ids)]
    assert data.val_bytes_per_target == len(reply.encode("utf-8")) / (len(reply) + 1)  # its text, then <|end|>
    again = fine_tuning_data(_file(tmp_path), BASE, block_size=64, val_fraction=0.2, seed=3)
    assert [r.ids for r in again.val_rows] == [val.ids]


def test_a_byte_level_vocabulary_gains_only_the_tokens(tmp_path):
    from scratchlm.text.tokenizer import train_tokenizer

    bpe = train_tokenizer("bpe", ["床前看月光 hello world " * 30], 300)
    data = fine_tuning_data(_file(tmp_path), bpe, block_size=64, val_fraction=0.4, seed=0)
    assert data.added_ids == list(range(bpe.vocab_size, bpe.vocab_size + 4))
    assert len(data.val_rows) == 2


def test_a_single_conversation_is_refused(tmp_path):
    with pytest.raises(UserError, match="holds one conversation"):
        fine_tuning_data(_file(tmp_path, n=1), BASE, block_size=64, val_fraction=0.1, seed=0)


def test_rows_are_cut_to_the_context_and_one_left_with_nothing_to_learn_names_its_line(tmp_path):
    data = fine_tuning_data(_file(tmp_path), BASE, block_size=10, val_fraction=0.2, seed=3)
    assert all(len(r.ids) <= 11 for r in data.train_rows + data.val_rows)
    with pytest.raises(UserError, match=r"chat.jsonl line 1: nothing to learn within the context of 8 tokens"):
        fine_tuning_data(_file(tmp_path), BASE, block_size=8, val_fraction=0.2, seed=3)  # 写一首诗。's reply starts at 9
