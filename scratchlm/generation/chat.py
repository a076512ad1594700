"""A conversation with a fine-tuned model: the history, rendered by the run's chat template, and
each reply streamed until the model writes <|end|>.

Every turn renders the whole history again (scratchlm.text.chat: <|bos|>, each turn's role token,
text and <|end|>, then <|assistant|>) and the model continues it. A history longer than the context
loses its oldest exchanges first (a system message stays), and says how many; a reply stops at
<|end|>, at a stop string, after max_new_tokens, or where the context is full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from scratchlm.data.conversations import Message
from scratchlm.errors import UserError
from scratchlm.generation.engine import Engine, sample_rows
from scratchlm.generation.settings import GenerationSettings
from scratchlm.generation.text_rows import IncrementalText, token_steps
from scratchlm.text.chat import END_TOKEN, ChatTemplate, has_chat_tokens


@dataclass
class ChatSession:
    """The model, its tokenizer and template, the settings of every reply, and the history."""

    engine: Engine
    template: ChatTemplate
    settings: GenerationSettings
    system: str | None = None
    history: list[Message] = field(default_factory=list)
    dropped: int = 0
    """Exchanges left out of the last reply's prompt to fit the context."""

    @classmethod
    def of(cls, model, tokenizer, settings: GenerationSettings, *, system: str | None = None,
           dtype=None) -> "ChatSession":
        if not has_chat_tokens(tokenizer):
            raise UserError("this run's tokenizer has no chat tokens: it was not fine-tuned on conversations; "
                            "fine-tune it first (`scratchlm sft --init_from RUN`), or continue text with "
                            "`scratchlm generate`")
        end = tokenizer.specials[END_TOKEN]
        template = ChatTemplate.of(tokenizer)
        return cls(Engine(model, tokenizer, dtype=dtype, eos_id=end), template, settings, system)

    def reset(self) -> None:
        self.history.clear()

    def _prompt(self, turns: list[Message]) -> list[int]:
        ids, self.dropped = fitted_prompt(self.template, self.engine.config.block_size, turns, self.system)
        return ids

    def reply(self, text: str) -> Iterator[str]:
        """Stream the reply to the user message `text` in printable pieces; once the stream ends (or is
        closed early, as Ctrl-C does), the message and the reply so far join the history."""
        turns = [*self.history, Message("user", text)]
        prompt = self._prompt(turns)
        room = self.engine.config.block_size - len(prompt)
        settings = dataclasses.replace(self.settings, max_new_tokens=min(self.settings.max_new_tokens, room))
        said: list[str] = []
        try:
            rows = sample_rows(self.engine, prompt, settings)
            for step in token_steps(rows, IncrementalText(settings.stop)):
                if step.text:
                    said.append(step.text)
                    yield step.text
        finally:
            self.history = [*turns, Message("assistant", "".join(said))]


def fitted_prompt(template: ChatTemplate, block_size: int, turns: list[Message],
                  system: str | None = None) -> tuple[list[int], int]:
    """(the prompt of `turns` after the system message, if any; the exchanges dropped): the oldest
    exchanges go first until the prompt leaves room for a reply; a last message that does not fit
    alone is refused."""
    head = [Message("system", system)] if system else []
    for start in range(0, len(turns), 2):  # turns alternate user, assistant: drop them in pairs
        ids = template.prompt(head + turns[start:])
        if len(ids) < block_size:
            return ids, start // 2
    raise UserError(f"the message is {len(template.prompt(head + turns[-1:]))} tokens with the template, and "
                    f"the model's context holds {block_size}: send a shorter one")
