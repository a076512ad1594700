"""`train --init_from`: a new run that starts from a trained model (a scratchlm run, or a Hugging
Face folder as export-hf writes it), keeps its architecture and tokenizer, and trains on new data
with a fresh optimizer. The weights really come along: the first step's loss is the source's
loss on that same batch, scored here with scratchlm.training.scoring; and a fine-tune resumes exactly."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchlm.errors import UserError
from helpers import assert_same_weights
from scratchlm.checkpoint import load_model
from scratchlm.training.scoring import score_ids
from scratchlm.training.train import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = "the king speaks to a queen of night and day my lord".split()
MODEL = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, dropout=0.0, pos_embedding="learned", lm_head_bias=False)


def _text(path: Path, seed: int, n: int = 300) -> Path:
    rng = random.Random(seed)
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(6)) for _ in range(n)) + "\n", encoding="utf-8")
    return path


def _config(tmp_path: Path, name: str, data: Path, **overrides) -> TrainConfig:
    values = dict(data=str(data), tokenizer="char", batch_size=4, max_steps=6, lr=3e-3, warmup_steps=1,
                  eval_interval=0, eval_iters=1, log_interval=1, checkpoint_interval=2, sample_tokens=0,
                  progress="quiet", out_dir=str(tmp_path / name), data_cache=str(tmp_path / "data"), threads=1,
                  model_overrides=MODEL)
    return TrainConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A small char-level run: the model to start from."""
    tmp = tmp_path_factory.mktemp("source")
    os.environ.setdefault("SCRATCHLM_CACHE", str(tmp / "cache"))
    train(_config(tmp, "run", _text(tmp / "a.txt", 0), max_steps=20))
    return tmp / "run"


def _first_batch_loss(model, run_dir: Path, cfg: TrainConfig) -> float:
    """The loss of `model` on the first training batch of the run in run_dir, as scratchlm eval
    scores it: each row of the batch is one window of block_size + 1 ids, every target scored."""
    from scratchlm.data import read_split
    from scratchlm.training.distributed import Dist
    from scratchlm.training.batches import RankBatches

    start = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    tokens = read_split(start["data_dir"], "train")
    block = model.config.block_size
    x, y = RankBatches(tokens, cfg.batch_size, block, cfg.seed, Dist()).next_batch()
    rows = torch.cat([x, y[:, -1:]], dim=1)  # (B, block + 1): inputs and the last target
    nll = sum(score_ids(model, row.tolist(), stride=block)[0] for row in rows)
    return nll / y.numel()


def test_init_from_a_run_starts_from_its_weights_and_tokenizer(tmp_path, source):
    src_model, src_tok, _ = load_model(source)
    cfg = _config(tmp_path, "tuned", _text(tmp_path / "b.txt", 1), init_from=str(source), max_steps=3, lr=1e-3,
                  model_overrides={})
    result = train(cfg)
    want = _first_batch_loss(src_model, tmp_path / "tuned", cfg)
    assert abs(result.losses[1] - want) < 1e-5, (result.losses[1], want)
    # against a control: the same run from fresh weights starts near ln(V), far from the source's loss
    fresh = train(_config(tmp_path, "fresh", tmp_path / "b.txt", max_steps=1))
    assert fresh.losses[1] > want + 0.5 and abs(fresh.losses[1] - math.log(src_tok.vocab_size)) < 0.5
    tuned, tuned_tok, info = load_model(tmp_path / "tuned")
    assert tuned.config == src_model.config and tuned_tok.chars == src_tok.chars
    assert info["config"]["train"]["init_from"] == str(source)


def test_a_fine_tune_resumes_exactly(tmp_path, source):
    data = _text(tmp_path / "b.txt", 2)
    whole = train(_config(tmp_path, "whole", data, init_from=str(source), max_steps=4, model_overrides={}))
    train(_config(tmp_path, "split", data, init_from=str(source), max_steps=2, model_overrides={}))
    from scratchlm.training.train import resume_config

    again = train(resume_config(tmp_path / "split", max_steps=4))
    assert again.losses == {s: whole.losses[s] for s in (3, 4)}
    assert_same_weights(tmp_path / "whole", tmp_path / "split")


@pytest.mark.parametrize("arch, layout", [
    ("gpt2", MODEL),
    ("gpt_neox", {**MODEL, "pos_embedding": "rope", "activation": "gelu"}),
    ("llama", {**MODEL, "pos_embedding": "rope", "norm": "rmsnorm", "activation": "swiglu", "mlp_bias": False,
               "proj_bias": False}),
])
def test_init_from_a_hugging_face_folder(tmp_path, arch, layout):
    """A bpe run exported with export-hf (weights and tokenizer.json) as GPT-2, GPT-NeoX or Llama,
    then trained on from there."""
    from scratchlm.hf.interop import export_hf

    run = tmp_path / "bpe-run"
    train(_config(tmp_path, "bpe-run", _text(tmp_path / "a.txt", 3), tokenizer="bpe", vocab_size=300, max_steps=4,
                  model_overrides=layout))
    model, tok, _ = load_model(run)
    export_hf(model, tmp_path / "hf", tok)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == arch
    cfg = _config(tmp_path, "from-hf", _text(tmp_path / "b.txt", 4), init_from=str(tmp_path / "hf"), max_steps=1,
                  model_overrides={})
    result = train(cfg)
    assert abs(result.losses[1] - _first_batch_loss(model, tmp_path / "from-hf", cfg)) < 1e-5
    _, tuned_tok, _ = load_model(tmp_path / "from-hf")
    assert tuned_tok.kind == "bpe" and tuned_tok.encode("the king") == tok.encode("the king")


def test_init_from_refuses_what_cannot_work(tmp_path, source):
    (tmp_path / "z.txt").write_text("zebra quiz\n" * 50, encoding="utf-8")  # z and q: not in the source's alphabet
    with pytest.raises(UserError, match="'z'"):
        train(_config(tmp_path, "bad", tmp_path / "z.txt", init_from=str(source), model_overrides={}))
    with pytest.raises(UserError, match="no such run"):
        train(_config(tmp_path, "bad2", tmp_path / "z.txt", init_from=str(tmp_path / "nowhere"), model_overrides={}))
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad2").exists()
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "scratchlm", "train", "--init_from", str(source), "--data", str(tmp_path / "z.txt"),
            "--out_dir", str(tmp_path / "c")]
    for extra, words in [(["--n_layer", "3"], "--init_from keeps"), (["--resume", str(source)], "--resume"),
                         (["--tokenizer", "bpe", "--vocab_size", "500"], "drop --tokenizer, --vocab_size")]:
        out = subprocess.run(argv + extra, capture_output=True, text=True, env=env, timeout=240)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and words in lines[0], out.stderr
    assert not (tmp_path / "c").exists()


def test_a_rope_models_context_may_grow_and_a_learned_tables_may_not(tmp_path, source):
    """--block_size with --init_from: refused in one line for a learned position table (its rows are
    the source's), taken for a RoPE model, whose weights come along unchanged."""
    text = _text(tmp_path / "b.txt", 1)
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "scratchlm", "train", "--init_from", str(source), "--data", str(text),
                          "--out_dir", str(tmp_path / "long"), "--block_size", "32"], capture_output=True, text=True,
                         env=env, timeout=240)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "16 learned rows" in lines[0], out.stderr
    assert not (tmp_path / "long").exists()
    rope = _config(tmp_path, "rope", text, max_steps=2, model_overrides={**MODEL, "pos_embedding": "rope"})
    train(rope)
    grown = _config(tmp_path, "grown", text, max_steps=2, lr=1e-12, min_lr=0.0, init_from=str(tmp_path / "rope"),
                    model_overrides={"block_size": 32})
    train(grown)
    before, _, _ = load_model(tmp_path / "rope")
    after, _, _ = load_model(tmp_path / "grown")
    assert after.config.block_size == 32 and before.config.block_size == 16
    for (name, a), (_, b) in zip(after.state_dict().items(), before.state_dict().items()):  # lr 1e-12: the source's
        torch.testing.assert_close(a, b, atol=1e-8, rtol=0, msg=name)  # weights, in a model of a longer context


@pytest.mark.parametrize("flags", [dict(tokenizer="bpe"), dict(vocab_size=500), dict(tokenizer_file="tok"),
                                   dict(tokenizer="char")])
def test_init_from_refuses_tokenizer_flags_as_it_refuses_model_flags(flags):
    """The source's tokenizer is the run's (its ids are what the weights learned): a tokenizer flag
    given with --init_from is refused, one line naming it, as --n_layer is; none given is fine."""
    from scratchlm.training.train import config_from_preset

    with pytest.raises(UserError, match="--init_from keeps the tokenizer") as info:
        config_from_preset("shakespeare-char", init_from="some-run", **flags)
    assert "--" + next(iter(flags)) in str(info.value)
    assert config_from_preset("shakespeare-char", init_from="some-run").init_from == "some-run"


def test_a_hugging_face_folders_changed_tokenizer_is_read_afresh(tmp_path):
    """The cached copy of a Hugging Face folder's tokenizer follows the file: renumber the ids in
    tokenizer.json and the next --init_from reads the new ids, never the copy of the old ones."""
    from scratchlm.model.config import GPTConfig
    from scratchlm.hf.interop import export_hf
    from scratchlm.model.gpt import GPT
    from scratchlm.training.sources import load_source
    from scratchlm.text.tokenizer import CharTokenizer, load_tokenizer

    tok = CharTokenizer("abc ")
    export_hf(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16)), tmp_path / "hf",
              tok)
    first = load_source(tmp_path / "hf", tmp_path / "cache")
    assert load_tokenizer(first.tokenizer_dir).encode("cab") == [3, 1, 2]  # ' ' 0, a 1, b 2, c 3
    path = tmp_path / "hf" / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["model"]["vocab"].update({"a": 3, "c": 1})  # a and c swap ids
    path.write_text(json.dumps(spec), encoding="utf-8")
    second = load_source(tmp_path / "hf", tmp_path / "cache")
    assert second.tokenizer_dir != first.tokenizer_dir
    assert load_tokenizer(second.tokenizer_dir).encode("cab") == [1, 3, 2]


def test_config_from_preset_keeps_the_sources_model_as_the_command_does():
    """Not only the command line: with init_from, config_from_preset (which the benchmarks call)
    keeps of the preset's model fields only its context, takes the caller's --dropout and
    --block_size, and refuses any other model field, in the command's words."""
    from scratchlm.training.train import config_from_preset

    cfg = config_from_preset("tang-poems", init_from="some-run", model_overrides={"dropout": 0.1})
    assert cfg.model_overrides == {"block_size": 64, "dropout": 0.1}  # tang-poems' context, and the flag
    assert config_from_preset("tang-poems").model_overrides["n_layer"] == 4  # no source: the preset's model
    with pytest.raises(UserError, match=r"keeps the model it starts from; drop --n_embd, --n_layer \(only"):
        config_from_preset("sft", init_from="some-run", model_overrides={"n_layer": 2, "n_embd": 64})
