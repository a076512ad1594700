"""Conversations in, as the ecosystem writes them: the data of supervised fine-tuning.

A JSONL file (one conversation per line) or a parquet file (one per row) holds rows of either form
Hugging Face's chat datasets use:

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, ...]}
    {"prompt": "...", "completion": "..."}          one turn: a user message and the reply

(a prompt or completion may also be a list of messages, as in TRL's conversational form; then only
the completion's replies are learned, as TRL learns them). A message's content is text, or a list
of parts of which only text parts ({"type": "text", "text": ...}) are taken. Other fields of a row
are left alone. Each conversation is checked as it is read, and the first that is
not one is an error naming its file and line (or row): an unknown role, a system message after
the first, a message that is not a role and a text, a conversation with no assistant turn to learn
from, a line that is not JSON, a file with no conversations at all.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from scratchlm.errors import UserError
from scratchlm.text.text_files import without_bom

ROLES = ("system", "user", "assistant")
PARQUET_ROWS = 256
CONVERSATION_SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class Message:
    role: str
    """system, user or assistant."""
    content: str


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]
    """In order; a system message only first; at least one assistant message."""
    learn_from: int = 0
    """The first message whose replies fine-tuning learns: a prompt-completion row's completion."""
    where: str = field(default="", compare=False)
    """Its file and line (or row), for a message that names it."""


def read_conversations(path: str | Path) -> list[Conversation]:
    """Every conversation of a .jsonl or .parquet file, checked (see the module's docstring)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if path.suffix.lower() == ".jsonl":
        rows = _jsonl_rows(path)
    elif path.suffix.lower() == ".parquet":
        rows = _parquet_rows(path)
    else:
        raise UserError(f"{path}: conversations come as .jsonl or .parquet, not {path.suffix or 'a file without a suffix'}")
    found = [dataclasses.replace(conversation(row, where), where=where) for row, where in rows]
    if not found:
        raise UserError(f"{path}: holds no conversations")
    return found


def conversation(row: Any, where: str) -> Conversation:
    """One row as a Conversation, or a UserError that begins with `where` (file and line)."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object with \"messages\", or with \"prompt\" and \"completion\"")
    learn_from = 0
    if row.get("messages") is not None:  # a parquet file of both forms holds nulls in the other's columns
        messages = messages_of(row["messages"], where, "messages")
    elif row.get("prompt") is not None and row.get("completion") is not None:
        prompt, completion = row["prompt"], row["completion"]
        messages = (messages_of(prompt, where, "prompt") if isinstance(prompt, list) else (_text(prompt, where, "user"),))
        learn_from = len(messages)
        messages += (messages_of(completion, where, "completion") if isinstance(completion, list)
                     else (_text(completion, where, "assistant"),))
    else:
        names = [repr(str(k))[:40] for k in row][:8] + (["..."] if len(row) > 8 else [])
        raise UserError(f"{where}: expected \"messages\", or \"prompt\" and \"completion\" "
                        f"(fields: {', '.join(names) or 'none'})")
    if not any(m.role == "assistant" for m in messages[learn_from:]):
        raise UserError(f"{where}: no assistant message{' in the completion' if learn_from else ''}: "
                        "a conversation needs a reply to learn from")
    system_first(messages, where)
    return Conversation(messages, learn_from)


def system_first(messages: Sequence[Message], where: str) -> None:
    """A system message comes first or not at all (the playground's chat checks this too)."""
    late = next((i for i, m in enumerate(messages) if m.role == "system" and i > 0), None)
    if late is not None:
        raise UserError(f"{where}: message {late + 1} is a system message; only the first may be")


def _text(value: Any, where: str, role: str) -> Message:
    if not isinstance(value, str):
        raise UserError(f"{where}: the {'prompt' if role == 'user' else 'completion'} must be text or a list "
                        f"of messages, got {_json_kind(value)}")
    return Message(role, unicode_text(value, where))


def unicode_text(text: str, where: str) -> str:
    """`text` itself, unless it holds a lone surrogate escape (half of a \\uXXXX pair: JSON allows
    it, Unicode text cannot hold it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{where}: a message holds a lone surrogate escape (half of a \\uXXXX pair), "
                        "which is not text") from None
    return text


def messages_of(value: Any, where: str, field: str = "") -> tuple[Message, ...]:
    """A JSON list of {"role", "content"} messages, checked; errors name `where` and the
    `field`'s message number (the playground's chat reads its requests' messages with it too)."""
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: \"{field}\" must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value, 1):
        label = f"{where}: {field} message {i}" if field else f"{where}: message {i}"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise UserError(f"{label} must be an object with a string \"role\" and \"content\"")
        if m["role"] not in ROLES:
            raise UserError(f"{label} has the role {m['role'][:40]!r}; the roles are {', '.join(ROLES)}")
        out.append(Message(m["role"], unicode_text(_content(m.get("content"), label), label)))
    return tuple(out)


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or the text parts of a list of parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        other = next((p.get("type") for p in content if p.get("type") != "text"), None)
        if other is not None:
            raise UserError(f"{where}: holds a part of type {str(other)[:20]!r}; only text parts are read")
        if all(isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
    raise UserError(f"{where}: \"content\" must be text or a list of text parts, got {_json_kind(content)}")


def _json_kind(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "text",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _jsonl_rows(path: Path) -> Iterator[tuple[Any, str]]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path} line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{where}: not UTF-8 text (a bad byte at offset {exc.start})") from None
            line = without_bom(line) if lineno == 1 else line
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:
                why = exc.args[0] if isinstance(exc, ValueError) else "nested too deeply"
                raise UserError(f"{where}: not valid JSON ({why})") from None
            yield row, where


def _parquet_rows(path: Path) -> Iterator[tuple[Any, str]]:
    """Rows as dicts, a batch at a time (nested columns, messages among them, come back as lists)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{path}: not a readable parquet file ({_first_line(exc)})") from None
    done = 0
    batches = pf.iter_batches(batch_size=PARQUET_ROWS)
    with pf:
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise UserError(f"{path}: cannot read row {done + 1:,} on ({_first_line(exc)})") from None
            if batch is None:
                return
            for i, row in enumerate(batch.to_pylist()):
                yield row, f"{path} row {done + i + 1:,}"
            done += batch.num_rows


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]
