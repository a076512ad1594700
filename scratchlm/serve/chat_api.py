"""The Chat tab's side of the API: a conversation from the page, rendered by the run's chat
template (scratchlm.text.chat), to reply to or to show.

    POST /api/chat            {"run", "messages": [{"role", "content"}, ...], generation settings}
                              -> the Generate tab's events (streams.py) for the assistant's reply:
                              the prompt is the template's (the conversation, then <|assistant|>),
                              the reply ends at <|end|>; start's "dropped" counts the oldest
                              exchanges left out so that the prompt leaves room for a reply
    POST /api/chat/template   {"run", "messages", "train_on"} -> the conversation as one training
                              row: each token's id, label, whether it is a special token of the
                              template, and whether the fine-tuning loss learns it

Messages are checked by a conversations file's own rules (data/conversations.py: known roles,
text content, a system message only first); a request also holds at most MAX_MESSAGES of them,
each of at most the prompt's character limit, with no keys besides "role" and "content".
"""

from __future__ import annotations

from typing import Any

from scratchlm.data.conversations import Message, messages_of, system_first
from scratchlm.errors import UserError
from scratchlm.generation.chat import fitted_prompt
from scratchlm.serve.labels import id_label
from scratchlm.text.chat import END_TOKEN, TRAIN_ON, ChatTemplate, has_chat_tokens

MAX_MESSAGES = 64


def chat_messages(value: Any, limits) -> list[Message]:
    """The request's "messages", checked by the conversations reader's own rules (roles, text
    content, a system message only first), besides the request's: at most MAX_MESSAGES, each
    of at most limits.prompt_chars characters, no other keys."""
    if not isinstance(value, list) or not value:
        raise UserError('messages: expected a list of {"role", "content"} objects, one or more')
    if len(value) > MAX_MESSAGES:
        raise UserError(f"messages: at most {MAX_MESSAGES} (start a new conversation), got {len(value)}")
    extra = next((i for i, m in enumerate(value, 1) if isinstance(m, dict) and set(m) - {"role", "content"}), None)
    if extra is not None:
        raise UserError(f'messages: message {extra} has keys besides "role" and "content"')
    messages = messages_of(value, "messages")
    system_first(messages, "messages")
    long = next((i for i, m in enumerate(messages, 1) if len(m.content) > limits.prompt_chars), None)
    if long is not None:
        raise UserError(f"messages: message {long} is longer than {limits.prompt_chars:,} characters")
    return list(messages)


def template_of(loaded) -> ChatTemplate:
    if not has_chat_tokens(loaded.tokenizer):
        raise UserError(f"{loaded.name} was not fine-tuned on conversations (its tokenizer has no chat tokens); "
                        "fine-tune it with `scratchlm sft`, or continue text on the Generate tab")
    return ChatTemplate.of(loaded.tokenizer)


def for_chat(loaded, request, messages: list[Message]) -> None:
    """Make a GenerateRequest (streams.py) the reply to `messages`: its prompt ids, its end token,
    its exchanges dropped, and at most the tokens the context has room for. On the model thread
    (the tokenizer's encode)."""
    if request.beams > 1 or request.forced:
        raise UserError("a chat reply is sampled or greedy: beams must be 1, and nothing forced")
    if messages[-1].role != "user":
        raise UserError("the last message must be the user's: the reply answers it")
    template = template_of(loaded)
    system = messages[0].content if messages[0].role == "system" else None
    block = loaded.model.config.block_size
    request.prompt_ids, request.dropped = fitted_prompt(template, block, messages[1 if system is not None else 0:],
                                                        system)
    request.end_id = loaded.tokenizer.specials[END_TOKEN]
    request.max_new_tokens = min(request.max_new_tokens, block - len(request.prompt_ids))


def template_view(loaded, messages: list[Message], train_on: str) -> dict[str, Any]:
    """The conversation as `scratchlm sft` trains on it (see the module). On the model thread."""
    if train_on not in TRAIN_ON:  # the request's words, not the command line's --train_on
        raise UserError(f"train_on: expected assistant or all, got {str(train_on)[:40]!r}")
    row = template_of(loaded).render(messages, train_on)
    special = {i: piece for piece, i in loaded.tokenizer.specials.items()}
    tokens = [{"id": i, "label": special.get(i) or id_label(loaded.tokenizer, i), "special": i in special,
               "loss": learned} for i, learned in zip(row.ids, row.loss_mask)]
    return {"run": loaded.name, "tokens": tokens, "learned": sum(row.loss_mask), "train_on": train_on,
            "block_size": loaded.model.config.block_size}

