"""The chat template: a conversation as one row of token ids, and which of them the model learns.

Each turn is a role token, the turn's text, and an end token; the row starts with BOS, as every
training document does:

    <|bos|> <|system|> You are a poet. <|end|> <|user|> Write ... <|end|> <|assistant|> 床前... <|end|>

The role and end tokens are special tokens of the run's tokenizer (never made from text, so a
message cannot forge a turn). Supervised fine-tuning learns the replies: the loss mask marks each
assistant turn's text and its end token (so the model learns where a reply stops), and nothing the
user or the system wrote. A prompt for generation ends with the assistant's role token: what the
model writes next is the reply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

from scratchlm.errors import UserError

ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
END_TOKEN = "<|end|>"
CHAT_TOKENS = (*ROLE_TOKENS.values(), END_TOKEN)
TRAIN_ON = ("assistant", "all")  # the replies only, or every turn
"""The special tokens the template needs, in the order a tokenizer gains them."""


def learned(index: int, role: str, train_on: str = "assistant", learn_from: int = 0) -> bool:
    """Whether message `index` (of `role`) is learned: a reply, or with `train_on`="all" any turn;
    never a message before `learn_from`."""
    return index >= learn_from and (role == "assistant" or train_on == "all")


@dataclass(frozen=True)
class ChatRow:
    ids: list[int]
    """<|bos|>, then each turn: its role token, its text's ids, <|end|>."""
    loss_mask: list[bool]
    """Per id: whether the model is trained to predict it (an assistant's text and its end)."""

    def targets(self, ignore_index: int = -100) -> list[int]:
        """The row's next-token targets (len(ids) - 1): ids[t + 1] where the mask holds it,
        else ignore_index, which the loss leaves out."""
        return [i if keep else ignore_index for i, keep in zip(self.ids[1:], self.loss_mask[1:])]


@dataclass(frozen=True)
class ChatTemplate:
    """The template over one tokenizer: its encode function and the ids of its special tokens."""

    encode: Callable[[str], list[int]]
    special: dict[str, int]
    """Each of CHAT_TOKENS -> its id."""
    bos_id: int

    @classmethod
    def of(cls, tokenizer) -> "ChatTemplate":
        """The template over a scratchlm tokenizer (any kind) that holds the chat tokens."""
        return cls(encode=tokenizer.encode, special=tokenizer.specials, bos_id=tokenizer.bos_id)

    def __post_init__(self) -> None:
        missing = [t for t in CHAT_TOKENS if t not in self.special]
        if missing:
            raise UserError(f"the tokenizer has no chat tokens {', '.join(missing)}; a run learns them in fine-tuning")

    def render(self, messages: Sequence, train_on: str = "assistant", learn_from: int = 0) -> ChatRow:
        """The conversation's row; `train_on`="all" learns every turn's text and end, not only
        the replies (the role tokens and BOS are never targets: they are the template's). Messages
        before `learn_from` (a prompt-completion row's prompt) are never learned."""
        if train_on not in TRAIN_ON:
            raise UserError(f"--train_on must be assistant or all, got {train_on!r}")
        ids, mask = [self.bos_id], [False]
        for i, m in enumerate(messages):
            if m.role not in ROLE_TOKENS:
                raise UserError(f"message {i + 1} has the role {str(m.role)[:40]!r}; the roles are {', '.join(ROLE_TOKENS)}")
            keep = learned(i, m.role, train_on, learn_from)
            text = self.encode(m.content)
            ids += [self.special[ROLE_TOKENS[m.role]], *text, self.special[END_TOKEN]]
            mask += [False, *([keep] * len(text)), keep]
        return ChatRow(ids, mask)

    def prompt(self, messages: Sequence) -> list[int]:
        """The ids a reply is generated after: the conversation so far, then <|assistant|>."""
        return [*self.render(messages).ids, self.special[ROLE_TOKENS["assistant"]]]


def jinja_template() -> str:
    """The template in Jinja, as Hugging Face's `chat_template` (tokenizer_config.json) and
    llama.cpp's `tokenizer.chat_template` (GGUF) hold it: the conversation's text with the role
    and end tokens spelled out, which an exported tokenizer reads back as their ids, so
    `apply_chat_template(messages, add_generation_prompt=True)` gives `ChatTemplate.prompt`'s ids."""
    return ("{%- set roles = " + json.dumps(ROLE_TOKENS) + " -%}{{ bos_token }}{%- for message in messages -%}"
            "{%- if message['role'] not in roles -%}{{ raise_exception('the roles are " + ", ".join(ROLE_TOKENS)
            + "; got ' + message['role']) }}{%- endif -%}"
            "{{ roles[message['role']] + message['content'] + '" + END_TOKEN + "' }}{%- endfor -%}"
            "{%- if add_generation_prompt -%}{{ roles['assistant'] }}{%- endif -%}")


def has_chat_tokens(tokenizer) -> bool:
    """Whether `tokenizer` (any kind) holds every token of the template: a fine-tuned run's does."""
    specials = getattr(tokenizer, "specials", {})
    return all(t in specials for t in CHAT_TOKENS)
