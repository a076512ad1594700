"""The chat template (scratchlm/text/chat.py): a conversation's row of ids and its loss mask, written
out by hand for a toy tokenizer; and the masked loss the model computes from the row's targets,
against the mean of -log p over the learned positions taken by hand from the logits."""

from __future__ import annotations

import math

import pytest
import torch

from scratchlm.data.conversations import Message
from scratchlm.errors import UserError
from scratchlm.text.chat import CHAT_TOKENS, ChatTemplate

LETTERS = "abcdefgh"
SPECIAL = {"<|system|>": 10, "<|user|>": 11, "<|assistant|>": 12, "<|end|>": 13}
BOS = 9


def _encode(text: str) -> list[int]:
    return [LETTERS.index(c) for c in text]


TEMPLATE = ChatTemplate(encode=_encode, special=SPECIAL, bos_id=BOS)
CHAT = [Message("system", "h"), Message("user", "ab"), Message("assistant", "cde"), Message("user", "f"),
        Message("assistant", "g")]


def test_a_conversation_is_bos_then_role_text_end_per_turn_and_the_replies_are_learned():
    row = TEMPLATE.render(CHAT)
    assert row.ids == [9, 10, 7, 13, 11, 0, 1, 13, 12, 2, 3, 4, 13, 11, 5, 13, 12, 6, 13]
    learned = [i for i, keep in zip(row.ids, row.loss_mask) if keep]
    assert learned == [2, 3, 4, 13, 6, 13]  # each reply's text and the end that closes it
    assert row.targets() == [-100] * 8 + [2, 3, 4, 13] + [-100] * 4 + [6, 13]


def test_train_on_all_learns_every_turns_text_but_never_the_templates_own_tokens():
    row = TEMPLATE.render(CHAT, train_on="all")
    learned = [i for i, keep in zip(row.ids, row.loss_mask) if keep]
    assert learned == [7, 13, 0, 1, 13, 2, 3, 4, 13, 5, 13, 6, 13]
    with pytest.raises(UserError, match="--train_on must be assistant or all"):
        TEMPLATE.render(CHAT, train_on="prompt")


def test_messages_before_learn_from_are_context_only():
    """A prompt-completion row: the prompt's own reply (cde) is context; only the completion's is learned."""
    row = TEMPLATE.render(CHAT, learn_from=3)
    assert [i for i, keep in zip(row.ids, row.loss_mask) if keep] == [6, 13]
    with pytest.raises(UserError, match="message 1 has the role 'tool'"):
        TEMPLATE.render([Message("tool", "x")])


def test_a_prompt_ends_with_the_assistants_role_token():
    assert TEMPLATE.prompt(CHAT[:2]) == [9, 10, 7, 13, 11, 0, 1, 13, 12]


def test_a_tokenizer_without_the_chat_tokens_is_refused_naming_them():
    with pytest.raises(UserError, match=r"no chat tokens <\|assistant\|>, <\|end\|>"):
        ChatTemplate(encode=_encode, special={t: i for t, i in SPECIAL.items() if t in CHAT_TOKENS[:2]}, bos_id=BOS)


@pytest.mark.parametrize("fused", [False, True])
def test_the_models_loss_on_a_rows_targets_is_the_mean_over_the_learned_positions(fused, monkeypatch):
    """The SFT objective is the model's own loss with the unlearned targets ignored: the same
    number as -log softmax(logits)[target] averaged by hand over the learned positions only."""
    from scratchlm.model import gpt as model_module
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    calls = []
    if fused:  # the fused path at this tiny size, and seen to be taken
        fused_fn = model_module.linear_cross_entropy
        monkeypatch.setattr(model_module, "FUSED_LOSS_MIN_SCORES", 0)
        monkeypatch.setattr(model_module, "linear_cross_entropy", lambda *a, **k: calls.append(1) or fused_fn(*a, **k))

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=32, n_layer=1, n_head=2, n_embd=16, dropout=0.0)).eval()
    row = TEMPLATE.render(CHAT)
    x = torch.tensor([row.ids[:-1]])  # (1, T)
    y = torch.tensor([row.targets()])  # (1, T)
    with torch.no_grad():
        logits, _ = model(x)
        _, loss = model(x, y, return_logits=not fused)
    logp = torch.log_softmax(logits[0].double(), dim=-1)
    kept = [(t, target) for t, target in enumerate(row.targets()) if target != -100]
    by_hand = -sum(float(logp[t, target]) for t, target in kept) / len(kept)
    assert len(kept) == 6 and len(calls) == int(fused)
    assert math.isclose(float(loss), by_hand, rel_tol=1e-5)
