"""Conversations in (scratchlm/data/conversations.py): both of the rows Hugging Face's chat datasets
write, from JSONL and from parquet, each read into the messages written by hand here; and each
kind of bad row refused with one line naming its file and line."""

from __future__ import annotations

import json

import pytest

from scratchlm.data.conversations import Conversation, Message, read_conversations
from scratchlm.errors import UserError

POEM = "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。"
ROWS = [
    {"messages": [{"role": "system", "content": "你是一位唐代诗人。"},
                  {"role": "user", "content": "写一首五言绝句，题为《静夜思》。"},
                  {"role": "assistant", "content": POEM}]},
    {"prompt": "续写：床前明月光，疑是地上霜。", "completion": "举头望明月，低头思故乡。", "id": 7},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                  {"role": "user", "content": "again"}, {"role": "assistant", "content": ""}]},
    {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]},
]
EXPECTED = [
    Conversation((Message("system", "你是一位唐代诗人。"), Message("user", "写一首五言绝句，题为《静夜思》。"),
                  Message("assistant", POEM))),
    Conversation((Message("user", "续写：床前明月光，疑是地上霜。"), Message("assistant", "举头望明月，低头思故乡。")), 1),
    Conversation((Message("user", "hi"), Message("assistant", "hello"), Message("user", "again"),
                  Message("assistant", ""))),
    Conversation((Message("user", "q"), Message("assistant", "a")), 1),
]


def _jsonl(tmp_path, lines: list[str], name: str = "chat.jsonl"):
    path = tmp_path / name
    path.write_bytes("\n".join(lines).encode("utf-8"))
    return path


def test_jsonl_rows_of_both_forms_read_as_written(tmp_path):
    lines = ["\ufeff" + json.dumps(ROWS[0], ensure_ascii=False), "", json.dumps(ROWS[1]), "   ",
             json.dumps(ROWS[2]), json.dumps(ROWS[3])]
    assert read_conversations(_jsonl(tmp_path, lines)) == EXPECTED


def test_parquet_rows_read_as_the_same_conversations(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    chats = [r for r in ROWS if "messages" in r]
    pq.write_table(pa.Table.from_pylist(chats), tmp_path / "chat.parquet", row_group_size=1)
    assert read_conversations(tmp_path / "chat.parquet") == [EXPECTED[0], EXPECTED[2]]
    pairs = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]
    pq.write_table(pa.Table.from_pylist(pairs), tmp_path / "pairs.parquet")
    assert read_conversations(tmp_path / "pairs.parquet") == [
        Conversation((Message("user", "a"), Message("assistant", "b")), 1),
        Conversation((Message("user", "c"), Message("assistant", "d")), 1)]
    both = [{**ROWS[0], "prompt": None, "completion": None},  # each row's other columns hold nulls
            {"messages": None, "prompt": "a", "completion": "b"}]
    pq.write_table(pa.Table.from_pylist(both), tmp_path / "both.PARQUET")
    assert read_conversations(tmp_path / "both.PARQUET") == [
        EXPECTED[0], Conversation((Message("user", "a"), Message("assistant", "b")), 1)]


@pytest.mark.parametrize("line, words", [
    ('{"messages": [{"role": "user", "content": "hi"}]}', "line 2: no assistant message"),
    ('{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}',
     "line 2: messages message 1 has the role 'tool'; the roles are system, user, assistant"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}, '
     '{"role": "assistant", "content": "a"}]}', "line 2: message 2 is a system message; only the first may be"),
    ('{"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}',
     'line 2: messages message 1: "content" must be text or a list of text parts, got null'),
    ('{"messages": [{"content": "q"}, {"role": "assistant", "content": "a"}]}',
     'line 2: messages message 1 must be an object with a string "role" and "content"'),
    ('{"messages": []}', 'line 2: "messages" must be a non-empty list of messages'),
    ('{"messages": "hello"}', 'line 2: "messages" must be a non-empty list of messages'),
    ('{"prompt": "q", "completion": 3}', "line 2: the completion must be text or a list of messages, got a number"),
    ('{"text": "just text"}', 'line 2: expected "messages", or "prompt" and "completion" (fields: \'text\')'),
    ('["user", "assistant"]', 'line 2: expected a JSON object'),
    ('{"messages": [', "line 2: not valid JSON"),
    ('{"prompt": "\\ud83d", "completion": "a"}', "line 2: a message holds a lone surrogate escape"),
    ('{"messages": [{"role": "user", "content": null}, {"role": "assistant", "content": "a"}]}',
     'line 2: messages message 1: "content" must be text or a list of text parts, got null'),
    ('{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}, '
     '{"role": "assistant", "content": "a"}]}', "messages message 1: holds a part of type 'image'"),
    ('{"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], '
     '"completion": [{"role": "user", "content": "more?"}]}', "line 2: no assistant message in the completion"),
    ('{"x\\ny": 1}', "(fields: 'x\\ny')"),
])
def test_a_bad_row_is_one_error_naming_its_line(tmp_path, line, words):
    good = json.dumps(ROWS[1])
    with pytest.raises(UserError) as caught:
        read_conversations(_jsonl(tmp_path, [good, line, good]))
    message = str(caught.value)
    assert words in message and "\n" not in message, message
    assert message.startswith(str(tmp_path / "chat.jsonl")), message


def test_bad_files_are_one_error_each(tmp_path):
    cases = {
        _jsonl(tmp_path, ["", "  "], "empty.jsonl"): "holds no conversations",
        tmp_path / "missing.jsonl": "no such file",
        _jsonl(tmp_path, ["x"], "chat.txt"): "conversations come as .jsonl or .parquet, not .txt",
        tmp_path: "not a file",
    }
    (tmp_path / "bytes.jsonl").write_bytes(b'{"prompt": "\xff", "completion": "a"}\n')
    cases[tmp_path / "bytes.jsonl"] = "line 1: not UTF-8 text (a bad byte at offset 12)"
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    cases[tmp_path / "broken.parquet"] = "not a readable parquet file"
    for path, words in cases.items():
        with pytest.raises(UserError) as caught:
            read_conversations(path)
        assert words in str(caught.value), (path, str(caught.value))


def test_a_bad_parquet_row_names_its_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [ROWS[0], {"messages": [{"role": "user", "content": "only a question"}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    with pytest.raises(UserError, match=r"chat\.parquet row 2: no assistant message"):
        read_conversations(tmp_path / "chat.parquet")


def test_text_parts_are_joined_and_a_prompts_own_replies_are_kept_apart(tmp_path):
    """Content given as parts (the multimodal datasets' form) is its text parts joined; in TRL's
    conversational prompt-completion form the prompt's assistant turns are context, not learned."""
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "写"}, {"type": "text", "text": "诗"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "床前"}]}]}
    trl = {"prompt": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                      {"role": "user", "content": "q2"}],
           "completion": [{"role": "assistant", "content": "a2"}]}
    got = read_conversations(_jsonl(tmp_path, [json.dumps(parts, ensure_ascii=False), json.dumps(trl)]))
    assert got == [Conversation((Message("user", "写诗"), Message("assistant", "床前"))),
                   Conversation((Message("user", "q1"), Message("assistant", "a1"), Message("user", "q2"),
                                 Message("assistant", "a2")), 3)]
