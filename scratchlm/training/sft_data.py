"""The fine-tuning stage's data: conversations read (scratchlm.data.conversations), the starting
model's tokenizer given what the chat template needs, and every conversation rendered as a row of
ids and a loss mask (scratchlm.text.chat), some held out for the validation loss.

    tokenizer   the source's, with <|system|> <|user|> <|assistant|> <|end|> after its last id,
                and, for a char vocabulary, each character of the conversations it lacks (before
                the tokens): the Tang base run has no 《》“”： that requests use
    context     each row cut to block_size + 1 ids, once, here: a conversation with nothing left to
                learn is refused before training starts, naming its file and line
    held out    a seeded choice of round(val_fraction * N) conversations (at least one), never
                trained on; the rest are the training rows
    bytes       the learned text's UTF-8 bytes per learned target of the held-out rows, which
                turns the validation loss into bits per byte as in pre-training
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scratchlm.data.conversations import Conversation, read_conversations
from scratchlm.errors import UserError
from scratchlm.text.chat import CHAT_TOKENS, ChatRow, ChatTemplate, learned
from scratchlm.training.sft_batches import cut_rows


@dataclass(frozen=True)
class FineTuningData:
    tokenizer: Any
    """The source's tokenizer with what the template and the conversations need added."""
    added_ids: list[int]
    """The ids the tokenizer gained (their model rows are new: scratchlm.training.vocab_rows)."""
    template: ChatTemplate
    train_rows: list[ChatRow]
    val_rows: list[ChatRow]
    val_bytes_per_target: float
    """UTF-8 bytes of the held-out rows' learned text per learned target (an <|end|> counts as a target of no bytes)."""


def fine_tuning_data(path: str | Path, tokenizer: Any, *, block_size: int, val_fraction: float, seed: int,
                     train_on: str = "assistant") -> FineTuningData:
    """The conversations of `path` ready for the stage (see the module's docstring)."""
    conversations = read_conversations(path)
    if len(conversations) < 2:
        raise UserError(f"{path}: holds one conversation; fine-tuning holds at least one out for its "
                        "validation loss, so it needs two or more")
    chars = {c for conv in conversations for m in conv.messages for c in m.content} if tokenizer.kind == "char" else ()
    grown = tokenizer.with_tokens(CHAT_TOKENS, chars=chars)
    added = list(range(tokenizer.vocab_size, grown.vocab_size))
    template = ChatTemplate.of(grown)
    n_val = min(len(conversations) - 1, max(1, round(val_fraction * len(conversations))))
    held = set(np.random.default_rng(seed).permutation(len(conversations))[:n_val].tolist())
    rows = cut_rows([template.render(c.messages, train_on, c.learn_from) for c in conversations], block_size,
                    [c.where for c in conversations])
    val = [i for i in range(len(conversations)) if i in held]
    return FineTuningData(
        tokenizer=grown, added_ids=added, template=template,
        train_rows=[rows[i] for i in range(len(rows)) if i not in held], val_rows=[rows[i] for i in val],
        val_bytes_per_target=_learned_bytes([conversations[i] for i in val], train_on)
        / max(1, sum(sum(rows[i].loss_mask[1:]) for i in val)))


def _learned_bytes(conversations: list[Conversation], train_on: str) -> int:
    """UTF-8 bytes of the messages the template learns in `conversations`."""
    return sum(len(m.content.encode("utf-8")) for c in conversations for i, m in enumerate(c.messages)
               if learned(i, m.role, train_on, c.learn_from))
