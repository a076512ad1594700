"""What a run keeps and where it goes next: --decay_steps ends the decay where it says, keep_last
prunes the run's old checkpoints, pruning never deletes the one `latest` names, a saved config
with a field missing is refused (a default would build another run), `--init_from` starts a fresh
AdamW, and a resume on another tokenizer is refused. Each of these survived a hand mutation of
issue 30 (scripts/mutate.py's HAND_MUTATIONS); the expectations are written by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from scratchlm.errors import UserError
from scratchlm import checkpoint as ck
from scratchlm.training.train import TrainConfig, learning_rate, resume_config, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY_MODEL = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, dropout=0.0)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _text(path: Path, seed: int = 0, n_lines: int = 120) -> Path:
    rng = random.Random(seed)
    words = "the a king queen speaks runs to of and in my thy lord love night day".split()
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))).capitalize() + "."
                              for _ in range(n_lines)) + "\n", encoding="utf-8")
    return path


def _config(tmp_path: Path, data: Path, **overrides) -> TrainConfig:
    values = dict(data=str(data), tokenizer="char", batch_size=2, max_steps=4, lr=3e-3, warmup_steps=1,
                  eval_interval=0, eval_iters=1, log_interval=1, checkpoint_interval=100, sample_tokens=0,
                  progress="quiet", out_dir=str(tmp_path / "run"), data_cache=str(tmp_path / "data"), threads=1,
                  dtype="float32", model_overrides=TINY_MODEL)
    return TrainConfig(**{**values, **overrides})


# --------------------------------------------------------------------------------------------
# --decay_steps
# --------------------------------------------------------------------------------------------


def test_decay_steps_ends_the_decay_there_and_not_at_max_steps():
    """Warmup 2, decay to step 12 of a 100-step run: the hand values of a cosine over 10 steps."""
    cfg = TrainConfig(lr=1.0, min_lr=0.2, warmup_steps=2, max_steps=100, decay_steps=12)
    assert learning_rate(1, cfg) == pytest.approx(1.0)
    assert learning_rate(7, cfg) == pytest.approx(0.6)  # halfway: 0.2 + 0.5 * (1 + cos(pi/2)) * 0.8
    assert learning_rate(12, cfg) == pytest.approx(0.2)  # the decay is over: min_lr from here on
    assert learning_rate(50, cfg) == pytest.approx(0.2)
    linear = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=100, decay_steps=10, lr_schedule="linear")
    assert learning_rate(4, linear) == pytest.approx(0.6)
    assert learning_rate(10, linear) == 0.0


# --------------------------------------------------------------------------------------------
# --time_limit
# --------------------------------------------------------------------------------------------


def test_time_share_decays_the_rate_when_it_is_further_along_than_the_steps():
    """Hand values: warmup 2 of 100 steps; at step 7 the steps are 5% along, the time 50%."""
    cfg = TrainConfig(lr=1.0, min_lr=0.2, warmup_steps=2, max_steps=100)
    assert learning_rate(7, cfg, time_share=0.5) == pytest.approx(0.6)  # 0.2 + 0.5 * (1 + cos(pi/2)) * 0.8
    assert learning_rate(7, cfg, time_share=1.0) == pytest.approx(0.2)
    assert learning_rate(1, cfg, time_share=0.9) == pytest.approx(1.0)  # warmup goes by steps
    assert learning_rate(51, cfg, time_share=0.1) == pytest.approx(0.6)  # the steps are further along: 49/98


@pytest.fixture
def ten_seconds_a_step(monkeypatch):
    """A clock for the run's training time that moves 10 s at each step and at nothing else."""
    import types

    from scratchlm.training import state as state_module
    from scratchlm.training import train as train_module

    now = [1000.0]
    monkeypatch.setattr(state_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    real_step = train_module.train_step

    def step(*args, **kwargs):
        now[0] += 10.0
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_step", step)


def test_a_time_limit_ends_the_run_at_the_first_step_that_reaches_it(tmp_path, ten_seconds_a_step):
    """35 s at 10 s a step: steps 1-4 (the 4th reaches 40 s), each at the rate of the time
    trained before it, then the end's evaluation and checkpoint; a resume with more time goes on
    from 40 s, one with none left is refused."""
    cfg = _config(tmp_path, _text(tmp_path / "t.txt"), max_steps=100, time_limit=35.0, lr=1.0, min_lr=0.0,
                  warmup_steps=0)
    result = train(cfg)
    assert result.step == 4 and not result.stopped and result.val_loss is not None
    assert ck.latest_checkpoint(result.run_dir).name == "ckpt-00000004"
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["lr"] for r in records if r["event"] == "train"]
    import math
    assert rates == pytest.approx([0.5 * (1 + math.cos(math.pi * t / 35)) for t in (0, 10, 20, 30)])
    with pytest.raises(UserError, match=r"trained 40.0 s and --time_limit is 35.*above 40"):
        train(resume_config(str(result.run_dir), time_limit=35.0))
    more = train(resume_config(str(result.run_dir), time_limit=55.0, max_steps=100))
    assert more.step == 6  # 50 s, then 60 s >= 55


# --------------------------------------------------------------------------------------------
# keep_last and pruning
# --------------------------------------------------------------------------------------------


def test_training_keeps_only_the_last_checkpoints_it_is_told_to(tmp_path):
    train(_config(tmp_path, _text(tmp_path / "a.txt"), max_steps=5, checkpoint_interval=1, keep_last=2))
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("ckpt-*")) == ["ckpt-00000004", "ckpt-00000005"]
    assert (run / "latest").read_text().strip() == "ckpt-00000005"


def _tiny_state() -> tuple[dict, dict]:
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    config = GPTConfig(vocab_size=11, **TINY_MODEL)
    return GPT(config).state_dict(), ck.SavedConfig(model=config.to_dict())


def test_pruning_never_deletes_the_checkpoint_latest_names(tmp_path):
    """A kill between a save's rename and its `latest` write leaves a newer checkpoint that
    `latest` does not name yet; a prune then must keep the one `latest` names, or the run has no
    checkpoint a resume accepts as its own."""
    state, config = _tiny_state()
    for step in (1, 2, 3):
        ck.save_checkpoint(tmp_path, step, state, config)
    (tmp_path / "latest").write_text("ckpt-00000002\n")  # as the kill left it: ckpt-3 renamed in, not named
    ck.prune_checkpoints(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-00000002", "ckpt-00000003"]
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "ckpt-00000002"
    assert ck.load_model(tmp_path)[2]["step"] == 2


# --------------------------------------------------------------------------------------------
# A saved config with a field missing
# --------------------------------------------------------------------------------------------


def _drop_field(ckpt: Path, section: str, field: str) -> bytes:
    path = ckpt / ck.CONFIG_FILE
    config = json.loads(path.read_text())
    del config[section][field]
    path.write_text(json.dumps(config))
    return path.read_bytes()


def test_a_saved_model_config_missing_a_field_is_refused(tmp_path):
    state, config = _tiny_state()
    ckpt = ck.save_checkpoint(tmp_path, 1, state, config)
    _drop_field(ckpt, "model", "n_head")  # its default (not 2) would split the same weights otherwise
    with pytest.raises(UserError, match="n_head"):
        ck.load_model(ckpt)


def test_a_run_whose_saved_training_config_misses_a_field_is_not_resumed(tmp_path):
    train(_config(tmp_path, _text(tmp_path / "a.txt"), max_steps=1))
    ckpt = tmp_path / "run" / "ckpt-00000001"
    before = _drop_field(ckpt, "train", "lr")  # a default of 6e-4 would quietly train on at another rate
    with pytest.raises(UserError, match="lr"):
        resume_config(tmp_path / "run", max_steps=2)
    assert (ckpt / ck.CONFIG_FILE).read_bytes() == before


# --------------------------------------------------------------------------------------------
# --init_from: the weights come along, the optimizer does not
# --------------------------------------------------------------------------------------------


def _optimizer_steps(ckpt: Path) -> set[int]:
    optimizer_state, _ = ck.load_training_state(ckpt)
    return {int(s["step"]) for s in optimizer_state["optimizer"]["state"].values()}


def test_init_from_starts_a_fresh_adamw(tmp_path):
    """The source ran 3 AdamW steps; a run started from it and trained 1 step has an optimizer
    that has taken exactly 1 (its moments are its own, not the source's carried on)."""
    data = _text(tmp_path / "a.txt")
    train(_config(tmp_path, data, max_steps=3, out_dir=str(tmp_path / "source")))
    assert _optimizer_steps(tmp_path / "source" / "ckpt-00000003") == {3}
    train(_config(tmp_path, _text(tmp_path / "b.txt", seed=1), max_steps=1, init_from=str(tmp_path / "source"),
                  out_dir=str(tmp_path / "tuned"), model_overrides={}))
    ckpt = tmp_path / "tuned" / "ckpt-00000001"
    assert _optimizer_steps(ckpt) == {1}
    # and a first AdamW step's second moment is (1 - beta2) g^2 of that one gradient: for every
    # parameter its largest entry is at most (1 - beta2) times the largest g^2 (the source's own
    # moments, carried on, would hold 3 steps' worth)
    optimizer_state, _ = ck.load_training_state(ckpt)
    beta2 = TrainConfig().beta2
    for s in optimizer_state["optimizer"]["state"].values():
        exp_avg = s["exp_avg"] / (1 - TrainConfig().beta1)  # the gradient itself, after one step
        assert torch.allclose(s["exp_avg_sq"], (1 - beta2) * exp_avg.square(), rtol=1e-4, atol=1e-12)


# --------------------------------------------------------------------------------------------
# Resuming on another tokenizer
# --------------------------------------------------------------------------------------------


def test_a_resume_on_another_tokenizer_is_refused_and_changes_nothing(tmp_path):
    """A run trained on BPE ids, resumed with --tokenizer char on the same text: the char ids
    (fewer than the model's vocabulary, so nothing else objects) would mean other pieces."""
    data = _text(tmp_path / "a.txt")
    train(_config(tmp_path, data, max_steps=1, tokenizer="bpe", vocab_size=300))
    run = tmp_path / "run"
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match="tokenizer bpe") as caught:
        train(resume_config(run, max_steps=2, tokenizer="char", vocab_size=None))
    assert "char" in str(caught.value)
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before
