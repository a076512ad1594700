"""The sft stage of the one training loop (`scratchlm sft`, `train --stage sft`): from a trained
char run, the chat tokens and the conversations' new characters join the tokenizer with new model
rows; the loss is on the replies; the validation loss the log reports is, by hand from the saved
checkpoint, the mean -log p over the learned targets of some held-out pair of conversations; a
fine-tune resumes exactly; bad input is one line and nothing written."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import assert_same_weights
from scratchlm.checkpoint import load_model
from scratchlm.errors import UserError
from scratchlm.text.chat import CHAT_TOKENS
from scratchlm.text.tokenizer import load_tokenizer
from scratchlm.training.train import TrainConfig, resume_config, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

POEM = "床前看月光，疑是地上霜。举头望山月，低头思故乡。\n"
CHATS = [("写一首诗。", "床前看月光，疑是地上霜。"), ("题为《月》。", "举头望山月，低头思故乡。"),
         ("再写一首。", "床前看月光。"), ("写《霜》。", "疑是地上霜。"), ("写山。", "举头望山月。"),
         ("写月。", "床前看月光。"), ("写故乡。", "低头思故乡。"), ("写地上。", "疑是地上霜。")]
MODEL = dict(n_layer=1, n_head=2, n_embd=32, block_size=32, dropout=0.0, lm_head_bias=False)


def _config(tmp_path: Path, name: str, **overrides) -> TrainConfig:
    values = dict(tokenizer="char", batch_size=2, max_steps=6, lr=3e-3, warmup_steps=1, eval_interval=0, eval_iters=1,
                  log_interval=1, checkpoint_interval=2, sample_tokens=0, progress="quiet",
                  out_dir=str(tmp_path / name), data_cache=str(tmp_path / "data"), threads=1, model_overrides=MODEL)
    return TrainConfig(**{**values, **overrides})


def _chat_file(path: Path) -> Path:
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CHATS]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("base")
    os.environ.setdefault("SCRATCHLM_CACHE", str(tmp / "cache"))
    (tmp / "poem.txt").write_text(POEM * 40, encoding="utf-8")
    train(_config(tmp, "run", data=str(tmp / "poem.txt"), max_steps=10))
    return tmp / "run"


def _sft(tmp_path, name, base, **overrides) -> TrainConfig:
    return _config(tmp_path, name, data=str(_chat_file(tmp_path / "chat.jsonl")), stage="sft", init_from=str(base),
                   val_fraction=0.25, model_overrides={}, **overrides)


def test_sft_grows_the_vocabulary_and_reports_the_held_out_replies_loss(tmp_path, base):
    result = train(_sft(tmp_path, "sft", base, eval_interval=3))
    base_tok = load_tokenizer(base / "tokenizer")
    tok = load_tokenizer(tmp_path / "sft" / "tokenizer")
    new_chars = sorted(set("".join(q + a for q, a in CHATS)) - set(base_tok.chars))
    assert new_chars  # 《》 and the requests' characters the poem lacks
    assert tok.vocab_size == base_tok.vocab_size + len(new_chars) + len(CHAT_TOKENS)
    assert all(tok.decode([i]) == base_tok.decode([i]) for i in range(base_tok.vocab_size))
    model, _, _ = load_model(tmp_path / "sft")
    assert model.config.vocab_size == tok.vocab_size
    # the held-out loss, by hand: each conversation's row built here, -log p over its reply and <|end|>
    user, assistant, end = (tok.specials[t] for t in ("<|user|>", "<|assistant|>", "<|end|>"))
    per_chat = []
    model.eval()
    with torch.no_grad():
        for q, a in CHATS:
            ids = [tok.bos_id, user, *tok.encode(q), end, assistant, *tok.encode(a), end]
            learned = set(range(len(ids) - len(a) - 1, len(ids)))  # positions of the reply and its end
            logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0][0].double(), dim=-1)
            per_chat.append([-float(logp[t - 1, ids[t]]) for t in sorted(learned)])
    reported = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    last_eval = [r for r in reported if r.get("event") == "eval"][-1]
    by_hand = [per_chat[i] + per_chat[j] for i, j in itertools.combinations(range(len(CHATS)), 2)]
    assert any(math.isclose(last_eval["val_loss"], sum(v) / len(v), rel_tol=1e-5) for v in by_hand)
    assert math.isclose(result.val_loss, last_eval["val_loss"])


def test_a_fine_tune_resumes_exactly(tmp_path, base):
    whole = train(_sft(tmp_path, "whole", base, max_steps=4))
    train(_sft(tmp_path, "split", base, max_steps=2))
    again = train(resume_config(tmp_path / "split", max_steps=4))
    assert again.losses == {s: whole.losses[s] for s in (3, 4)}
    assert_same_weights(tmp_path / "whole", tmp_path / "split")


@pytest.mark.parametrize("extra, words", [
    ([], "give --init_from"),
    (["--init_from", "{base}", "--data", "{tmp}/poem.txt"], "give --data FILE.jsonl"),
    (["--init_from", "{base}", "--data", "{tmp}/missing.jsonl"], "no such file"),
    (["--init_from", "{base}", "--data", "{tmp}/chat.jsonl", "--train_on", "prompt"], "train_on"),
])
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, base, extra, words):
    _chat_file(tmp_path / "chat.jsonl")
    (tmp_path / "poem.txt").write_text(POEM, encoding="utf-8")
    args = [a.format(base=base, tmp=tmp_path) for a in extra]
    if "--data" not in args:
        args += ["--data", str(tmp_path / "chat.jsonl")]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "scratchlm", "sft", *args, "--out_dir", str(out), "--progress", "quiet"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert not out.exists()


def test_the_log_counts_the_rows_real_tokens_not_their_padding(tmp_path, base):
    # a batch of all six training conversations: every step trains on each of them once
    result = train(_sft(tmp_path, "count", base, batch_size=6, max_steps=2))
    tok = load_tokenizer(tmp_path / "count" / "tokenizer")
    inputs = [len(tok.encode(q)) + len(tok.encode(a)) + 4 for q, a in CHATS]  # bos, user, end, assistant, end; less one
    by_hand = {sum(inputs) - inputs[i] - inputs[j] for i, j in itertools.combinations(range(len(CHATS)), 2)}
    assert result.tokens_seen % 2 == 0 and result.tokens_seen // 2 in by_hand
    assert result.tokens_seen < 2 * 6 * MODEL["block_size"]


def test_a_conversation_past_the_context_is_refused_before_training_naming_its_line(tmp_path, base):
    path = _chat_file(tmp_path / "chat.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = json.dumps({"messages": [{"role": "user", "content": "写" * 40}, {"role": "assistant", "content": "月。"}]},
                          ensure_ascii=False) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    cfg = _config(tmp_path, "long", data=str(path), stage="sft", init_from=str(base), val_fraction=0.25, model_overrides={})
    with pytest.raises(UserError, match=r"chat.jsonl line 3: nothing to learn within the context of 32 tokens"):
        train(cfg)
    assert not (tmp_path / "long").exists()


@pytest.mark.parametrize("change", [dict(val_fraction=0.5), dict(seed=7), dict(train_on="all")])
def test_a_resume_refuses_another_split_or_loss_mask(tmp_path, base, change):
    train(_sft(tmp_path, "run", base, max_steps=2))
    before = sorted(p.name for p in (tmp_path / "run").rglob("*"))
    with pytest.raises(UserError, match="cannot resume the fine-tuning batches"):
        train(resume_config(tmp_path / "run", max_steps=4, **change))
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == before


def test_a_resume_on_data_with_a_new_character_names_the_data(tmp_path, base):
    train(_sft(tmp_path, "run", base, max_steps=2))
    path = tmp_path / "chat.jsonl"
    path.write_text(path.read_text(encoding="utf-8").replace("写山。", "写河。"), encoding="utf-8")  # 河: a new character
    with pytest.raises(UserError, match="the training data changed since the run began"):
        train(resume_config(tmp_path / "run", max_steps=4))


def test_sft_refuses_a_pretraining_run_to_resume_and_pretraining_flags(tmp_path, base):
    _chat_file(tmp_path / "chat.jsonl")
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
    for args, words in (
            (["--resume", str(base)], f"{base} is a pretrain run: continue it with `scratchlm train --resume"),
            (["--init_from", str(base), "--data", str(tmp_path / "chat.jsonl"), "--out_dir", str(tmp_path / "o"),
              "--eval_iters", "5"], "--eval_iters is a pre-training setting")):
        proc = subprocess.run([sys.executable, "-m", "scratchlm", "sft", *args, "--progress", "quiet"],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"error: {proc.stderr.strip()[7:]}"]
        assert words in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()
