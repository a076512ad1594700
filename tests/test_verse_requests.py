"""Requests for poems in fixed words (scratchlm.text.verse_requests) and the `tang-sft` rows made
from corpus documents (scratchlm.data.tang_sft): each kind's words, read back; replies in and out
of form, judged against counts made by hand; a held-out title never reaching the training rows."""

from __future__ import annotations

import pytest

from scratchlm.data.tang_sft import held_out, regular_poem, requests
from scratchlm.text.verse_requests import Form, continue_request, form_of, heads_request, obeys, title_request

JUEJU = "床前看月光，疑是地上霜。\n举头望山月，低头思故乡。"
QIYAN = "朝辞白帝彩云间，千里江陵一日还。\n两岸猿声啼不住，轻舟已过万重山。"


def test_each_kind_is_written_in_its_words_and_read_back():
    assert title_request(5, 4, "静夜思") == "写一首五言绝句，题为《静夜思》。"
    assert title_request(7, 8, "秋兴") == "写一首七言律诗，题为《秋兴》。"
    assert heads_request(7, "春夏秋冬") == "写一首七言绝句，藏头“春夏秋冬”。"
    assert continue_request("床前看月光，疑是地上霜。") == "续写：床前看月光，疑是地上霜。"
    assert form_of("写一首五言绝句，题为《静夜思》。") == Form("title", 5, 4)
    assert form_of("写一首七言律诗，题为《秋兴》。") == Form("title", 7, 8)
    assert form_of("写一首七言绝句，藏头“春夏秋冬”。") == Form("heads", 7, 4, "春夏秋冬")
    assert form_of("续写：床前看月光，疑是地上霜。") == Form("continue", 5, None)
    for other in ["写一首诗。", "写一首六言绝句，题为《夜》。", "续写：床前看月光", "续写：床前看月光，疑是地上。",
                  "写一首五言绝句，藏头“春夏”。"]:
        assert form_of(other) is None, other


@pytest.mark.parametrize("request_, reply, ok", [
    ("写一首五言绝句，题为《静夜思》。", JUEJU, True),
    ("写一首七言绝句，题为《静夜思》。", JUEJU, False),  # 5 characters a clause, not 7
    ("写一首五言律诗，题为《静夜思》。", JUEJU, False),  # 4 clauses, not 8
    ("写一首五言律诗，题为《静夜思》。", JUEJU + "\n" + JUEJU, True),
    ("写一首五言绝句，题为《静夜思》。", "床前看月光，疑是地上霜。举头望山月，低头思故乡。", False),  # two couplets on one line
    ("写一首五言绝句，题为《静夜思》。", "床前看月光，疑是地上霜。\n举头望山，低头思故乡。", False),
    ("写一首五言绝句，题为《静夜思》。", "床前看月光，疑是地上霜。\n举头望ab，低头思故乡。", False),
    ("写一首五言绝句，题为《静夜思》。", "", False),
    ("写一首七言绝句，藏头“朝千两轻”。", QIYAN, True),
    ("写一首七言绝句，藏头“朝千两重”。", QIYAN, False),  # the 4th clause begins with 轻
    ("续写：床前看月光，疑是地上霜。", "举头望山月，低头思故乡。", True),
    ("续写：床前看月光，疑是地上霜。", "举头望山月，低头思故乡。\n" * 3, True),
    ("续写：朝辞白帝彩云间，千里江陵一日还。", "举头望山月，低头思故乡。", False),  # 5, not the given 7
    ("写一首诗。", JUEJU, False),
])
def test_a_reply_obeys_when_its_clauses_match_the_request(request_, reply, ok):
    assert obeys(request_, reply) is ok


def test_tang_sft_rows_take_turns_and_keep_held_out_titles_apart():
    poems = [f"题{i}\n{JUEJU}\n" if i % 2 else f"长题{i}\n{JUEJU}\n{JUEJU}\n" for i in range(60)]
    poems += ["杂诗\n床前看月光，疑是地上霜。\n", "乱\n床前看月光，疑是地霜。\n举头望山月，低头思故乡。\n"]  # not regular
    rows = list(requests(iter(poems)))
    assert len(rows) == 60  # the two irregular documents give none
    by_kind = {"title": 0, "heads": 0, "continue": 0}
    for (split, row), text in zip(rows, poems):
        title, lines, length = regular_poem(text)
        form = form_of(row["prompt"])
        assert form is not None and form.length == length == 5
        by_kind[form.kind] += 1
        assert split == ("held-out" if held_out(title) else "train")
        if form.kind == "continue":
            assert row["prompt"] == "续写：" + lines[0] and row["completion"] == "\n".join(lines[1:])
        else:
            assert row["completion"] == "\n".join(lines)
        if form.kind == "heads":
            assert len(lines) == 2 and form.heads == "床疑举低"
        assert obeys(row["prompt"], row["completion"])  # the corpus's own poem is in the form it is asked for
    assert by_kind == {"title": 30, "heads": 10, "continue": 20}  # heads only on the 绝句 turns
    assert {split for split, _ in rows} == {"train", "held-out"}
