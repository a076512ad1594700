"""A fine-tuned run's chat template in its exports: transformers' own `apply_chat_template` on the
`export-hf` folder gives the ids scratchlm's template gives, for each tokenizer kind, and its
tokenizer holds the chat tokens at scratchlm's ids."""

from __future__ import annotations

import pytest
import torch

from conftest import shared_file
from scratchlm.data.conversations import Message
from scratchlm.hf.interop import export_hf
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.text.chat import CHAT_TOKENS, ChatTemplate
from scratchlm.text.tokenizer import CharTokenizer, GPT2Tokenizer, train_tokenizer

POEM = "床前看月光，疑是地上霜。举头望山月，低头思故乡。"
TEXT = "You are a poet. Write a line about the sea, number 3. Hello world! " + POEM + "写一首五言绝句，题为《秋夜》。"
CONVERSATIONS = [
    [Message("user", "写一首五言绝句，题为《秋夜》。")],
    [Message("system", "You are a poet."), Message("user", "Hello world!"), Message("assistant", POEM[:12]),
     Message("user", "Write a line about the sea, number 3.")],
    [Message("user", " Hello"), Message("assistant", "world! "), Message("user", "\n" + POEM)],  # spaces at the seams
]


def _kinds():
    return [pytest.param(lambda: CharTokenizer.train([TEXT + " \n"]), id="char"),
            pytest.param(lambda: train_tokenizer("bpe", [TEXT * 20], 320), id="bpe"),
            pytest.param(lambda: GPT2Tokenizer.from_rank_file(shared_file("gpt2/gpt2.tiktoken")), id="gpt2")]


@pytest.mark.parametrize("make", _kinds())
def test_apply_chat_template_on_the_export_gives_scratchlms_ids(make, tmp_path):
    from transformers import AutoTokenizer

    grown = make().with_tokens(CHAT_TOKENS)
    template = ChatTemplate(encode=grown.encode, special=grown.specials, bos_id=grown.bos_id)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=grown.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16, lm_head_bias=False))
    hf = AutoTokenizer.from_pretrained(export_hf(model, tmp_path / "hf", grown))
    assert {t: hf.convert_tokens_to_ids(t) for t in CHAT_TOKENS} == {t: grown.specials[t] for t in CHAT_TOKENS}
    for messages in CONVERSATIONS:
        as_dicts = [{"role": m.role, "content": m.content} for m in messages]
        prompt = hf.apply_chat_template(as_dicts, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert prompt == template.prompt(messages)
        whole = hf.apply_chat_template(as_dicts, tokenize=True, return_dict=False)
        assert whole == template.render(messages).ids


def test_an_unknown_role_is_refused_by_the_exported_template(tmp_path):
    from transformers import AutoTokenizer

    grown = CharTokenizer.train([TEXT]).with_tokens(CHAT_TOKENS)
    model = GPT(GPTConfig(vocab_size=grown.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16, lm_head_bias=False))
    hf = AutoTokenizer.from_pretrained(export_hf(model, tmp_path / "hf", grown))
    with pytest.raises(Exception, match="the roles are system, user, assistant"):
        hf.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_a_run_without_the_chat_tokens_exports_no_template(tmp_path):
    from transformers import AutoTokenizer

    tok = CharTokenizer.train([TEXT])
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16, lm_head_bias=False))
    hf = AutoTokenizer.from_pretrained(export_hf(model, tmp_path / "hf", tok))
    assert hf.chat_template is None
    assert hf.split_special_tokens  # text is read literally, as scratchlm encodes it
