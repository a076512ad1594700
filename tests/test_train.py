"""The training loop through its real entry points, on tiny models and a small text written here."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchlm.cli.main import main as cli_main
from scratchlm.errors import UserError
from scratchlm.model.gpt import GPT
from scratchlm import checkpoint as ck
from scratchlm.training.train import TrainConfig, cli_fields, config_from_preset, learning_rate, make_optimizer, train

from helpers import assert_same_weights, write_text

TINY_MODEL = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, dropout=0.0)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # the CPU FLOP probe and prepared data go to a per-session folder, not the user's home
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # train(threads=1) must not slow down the tests that follow


def tiny_config(tmp_path: Path, data: Path, **overrides) -> TrainConfig:
    model_overrides = {**TINY_MODEL, **overrides.pop("model_overrides", {})}
    values = dict(
        data=str(data), tokenizer="char", batch_size=4, max_steps=20, lr=3e-3, min_lr=3e-4, warmup_steps=3,
        eval_interval=5, eval_iters=2, log_interval=1, checkpoint_interval=100, sample_tokens=0,
        progress="quiet", out_dir=str(tmp_path / "run"), data_cache=str(tmp_path / "data"),
        threads=1, model_overrides=model_overrides,
    )
    values.update(overrides)
    return TrainConfig(**values)


def test_learning_rate_schedule_by_hand():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=4, max_steps=14)
    assert [learning_rate(s, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert learning_rate(4, cfg) == pytest.approx(1.0)
    # halfway through the 10 decay steps the cosine is at its midpoint: (1 + 0.1) / 2
    assert learning_rate(9, cfg) == pytest.approx(0.55)
    assert learning_rate(14, cfg) == pytest.approx(0.1) and learning_rate(99, cfg) == pytest.approx(0.1)
    linear = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=10, lr_schedule="linear")
    assert learning_rate(5, linear) == pytest.approx(0.5)
    assert learning_rate(7, TrainConfig(lr=0.5, warmup_steps=0, lr_schedule="constant")) == 0.5


def test_weight_decay_only_on_matrices():
    model = GPT(TrainConfig().model_config(50))
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (p.dim() == 2), name
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_resume_is_bit_exact(tmp_path):
    """20 steps straight == 10 steps, a stop (checkpoint), a resume and 10 more; dropout on, so the
    RNG states must come back too."""
    data = write_text(tmp_path / "text.txt")
    # evaluations and samples every 5 steps run in both; they must not disturb the training RNGs
    straight = train(tiny_config(tmp_path, data, out_dir=str(tmp_path / "a"), sample_tokens=8,
                                 model_overrides={"dropout": 0.1}))
    cfg = tiny_config(tmp_path, data, out_dir=str(tmp_path / "b"), sample_tokens=8, model_overrides={"dropout": 0.1})
    first = train(cfg, on_step=lambda step, record: step == 10)
    assert first.stopped and first.step == 10
    assert (tmp_path / "b" / "latest").read_text().strip() == "ckpt-00000010"
    second = train(tiny_config(tmp_path, data, out_dir=None, resume=str(tmp_path / "b"), sample_tokens=8,
                               model_overrides={"dropout": 0.1}))
    assert sorted(second.losses) == list(range(11, 21))
    resumed = {**first.losses, **second.losses}
    assert resumed == straight.losses  # exact float equality, step by step
    assert second.val_loss == straight.val_loss
    assert_same_weights(tmp_path / "a", tmp_path / "b")


def test_an_existing_run_is_never_overwritten(tmp_path):
    data = write_text(tmp_path / "text.txt")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="--resume"):
        train(tiny_config(tmp_path, data, max_steps=2))
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_overfits_one_sentence(tmp_path):
    """Station 17: memorise one sentence through the real train path; greedy decoding must then recite it."""
    sentence = "the quick brown fox jumps over the lazy dog."
    data = tmp_path / "one.txt"
    data.write_text((sentence + "\n") * 40, encoding="utf-8")
    cfg = tiny_config(tmp_path, data, max_steps=150, lr=1e-2, min_lr=1e-3, warmup_steps=10, eval_interval=0,
                      batch_size=8, model_overrides={"n_embd": 48, "n_layer": 2})
    result = train(cfg)
    assert result.losses[150] < 0.1 < result.losses[1]
    assert result.val_loss < 0.1
    model, tok, _ = ck.load_model(result.run_dir)
    idx = torch.tensor([tok.encode("the quick")])
    with torch.no_grad():
        for _ in range(len(sentence) - len("the quick")):
            logits, _ = model(idx[:, -16:])
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert tok.decode(idx[0].tolist()) == sentence


def _nan_on_training_calls(monkeypatch, bad_calls):
    """Make the model's loss NaN on the given training forward calls (1-based)."""
    original = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        if self.training and targets is not None:
            calls["n"] += 1
            if calls["n"] in bad_calls:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


def test_non_finite_steps_are_skipped_and_counted(tmp_path, monkeypatch):
    data = write_text(tmp_path / "text.txt")
    _nan_on_training_calls(monkeypatch, {4, 5})
    snapshots = {}

    def snapshot(step, record):
        snapshots[step] = [p.detach().clone() for p in model_ref[0].parameters()] if model_ref else None

    model_ref = []
    original_init = GPT.__init__

    def init(self, config):
        original_init(self, config)
        model_ref.append(self)

    monkeypatch.setattr(GPT, "__init__", init)
    result = train(tiny_config(tmp_path, data, max_steps=8, eval_interval=0), on_step=snapshot)
    assert result.bad_steps == 2 and not result.stopped
    assert math.isnan(result.losses[4]) and math.isnan(result.losses[5])
    assert all(math.isfinite(result.losses[s]) for s in (1, 2, 3, 6, 7, 8))
    for before, after in zip(snapshots[3], snapshots[5]):  # steps 4 and 5 left the weights alone
        assert torch.equal(before, after)
    assert any(not torch.equal(a, b) for a, b in zip(snapshots[5], snapshots[6]))
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "bad_step"] == [4, 5]


def test_too_many_bad_steps_stop_with_step_and_last_checkpoint(tmp_path, monkeypatch):
    data = write_text(tmp_path / "text.txt")
    _nan_on_training_calls(monkeypatch, set(range(7, 100)))
    cfg = tiny_config(tmp_path, data, max_steps=50, checkpoint_interval=3, max_bad_steps=3, eval_interval=0)
    with pytest.raises(UserError) as info:
        train(cfg)
    message = str(info.value)
    assert "step 9" in message and "ckpt-00000006" in message
    assert ck.load_model(tmp_path / "run")[2]["step"] == 6  # the bad steps were never saved


def test_bfloat16_autocast_and_activation_checkpointing_train_on_cpu(tmp_path, monkeypatch):
    """Each switch shown by what is only true when it is on (MUTATION, issue 21: autocast as a
    null context and checkpointing off passed the old "finite and falling" test): bfloat16
    autocast moves the losses off float32's, within a bound; checkpointing runs every block's
    forward a second time in the backward pass (counted)."""
    from scratchlm.model import gpt as model_module

    calls = []
    forward = model_module.Block.forward

    def counted(self, *args, **kwargs):
        if self.training and torch.is_grad_enabled():
            calls.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(model_module.Block, "forward", counted)
    data = write_text(tmp_path / "text.txt")
    result = train(tiny_config(tmp_path, data, max_steps=6, dtype="bfloat16", activation_checkpointing=True,
                               eval_interval=0))
    checkpointed = len(calls)
    calls.clear()
    plain = train(tiny_config(tmp_path, data, max_steps=6, dtype="float32", eval_interval=0,
                              out_dir=str(tmp_path / "fp32")))
    layers = TINY_MODEL["n_layer"]
    assert len(calls) == 6 * layers and checkpointed == 2 * 6 * layers
    assert all(math.isfinite(v) for v in result.losses.values())
    assert result.losses[6] < result.losses[1]
    gaps = [abs(result.losses[s] - plain.losses[s]) for s in range(1, 7)]
    assert 0 < max(gaps) < 0.05, gaps  # bfloat16's rounding shows, and stays small


@pytest.mark.parametrize("native", ["0", "1"])
def test_auto_dtype_trains_in_what_the_cpu_multiplies_natively(tmp_path, monkeypatch, native):
    """--dtype auto: bfloat16 on a CPU with bfloat16 units, float32 on one without (forced here
    both ways); the run's saved config records the choice, and the losses are those of a run
    given that dtype outright."""
    from scratchlm.machine.cpu import auto_dtype

    monkeypatch.setenv("SCRATCHLM_CPU_BF16", native)
    want = "bfloat16" if native == "1" else "float32"
    assert auto_dtype("cpu") == want
    data = write_text(tmp_path / "text.txt")
    auto = train(tiny_config(tmp_path / "a", data, max_steps=4, dtype="auto", eval_interval=0))
    fixed = train(tiny_config(tmp_path / "b", data, max_steps=4, dtype=want, eval_interval=0))
    assert auto.losses == fixed.losses
    saved = ck.SavedConfig.read(ck.latest_checkpoint(tmp_path / "a" / "run"))
    assert saved.train["dtype"] == want
    assert config_from_preset("gpt2-124m").dtype == config_from_preset("seed-400m").dtype == "auto"


def test_the_training_log_prints_the_flops_per_token_inspect_prints(tmp_path, capsys):
    """One count of FLOPs per token: the run's first line and `scratchlm inspect`'s training row
    (at the training context) say the same figure for the same model, and it is the hand count
    3 * (2 * matmul weights + 4 * n_layer * T * C)."""
    from scratchlm.machine.flops import si_units
    from scratchlm.inside.introspect import format_report, inspect_report

    data = write_text(tmp_path / "text.txt")
    result = train(tiny_config(tmp_path, data, max_steps=2, eval_interval=0, progress="lines"))
    printed = capsys.readouterr().out.splitlines()[0]
    model, _, _ = ck.load_model(ck.latest_checkpoint(result.run_dir))
    C, L, T, V, hidden = 32, 1, 16, model.config.vocab_size, model.config.mlp_hidden
    by_hand = 3 * (2 * (L * (4 * C * C + 2 * C * hidden) + V * C) + 4 * L * T * C)
    assert f"{si_units(by_hand)}FLOP per token (training)" in printed
    inspect_row = next(line for line in format_report(inspect_report(model)).splitlines() if "training   3 * forward" in line)
    assert inspect_row.endswith(f"{si_units(by_hand)}FLOP")


def test_cli_trains_evaluates_samples_and_plots(tmp_path, capsys):
    data = write_text(tmp_path / "text.txt")
    run = tmp_path / "cli-run"
    code = cli_main([
        "train", "--preset", "shakespeare-char", "--data", str(data), "--max_steps", "4", "--n_layer", "1",
        "--n-embd", "32", "--block_size", "16", "--batch_size", "2", "--eval_iters", "2", "--sample_tokens", "20",
        "--out_dir", str(run), "--data_cache", str(tmp_path / "data"), "--progress", "lines",
    ])
    out = capsys.readouterr().out
    assert code == 0
    assert "step 1/4: loss" in out and "val loss" in out and "bits/byte" in out and "sample" in out
    assert f"scratchlm generate --checkpoint {run}" in out
    saved = ck.SavedConfig.read(ck.latest_checkpoint(run))
    assert saved.model["n_layer"] == 1 and saved.model["n_embd"] == 32 and saved.model["n_head"] == 4
    assert saved.train["preset"] == "shakespeare-char" and saved.tokenizer["kind"] == "char"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["event"] == "eval"]
    meta_dir = Path(records[0]["data_dir"])
    meta = json.loads((meta_dir / "meta.json").read_text())
    # bits per byte from its definition: nats per token -> bits per token -> bits per UTF-8 byte
    expected = evals[-1]["val_loss"] / math.log(2) * meta["val_tokens"] / meta["val_bytes"]
    assert evals[-1]["val_bpb"] == pytest.approx(expected)
    assert evals[-1]["val_ppl"] == pytest.approx(math.exp(evals[-1]["val_loss"]))
    assert cli_main(["plot", str(run), "--out", str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same run directory again is refused, with the way out named
    code = cli_main(["train", "--data", str(data), "--out_dir", str(run), "--max_steps", "1"])
    assert code == 2 and "--resume" in capsys.readouterr().err


def test_help_lists_every_field_with_its_default(capsys):
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for f in cli_fields():
        assert f"--{f.name}" in text, f.name
    assert "--n_layer" in text and "(default: 2)" in text and "--lr" in text and "(default: 0.0003)" in text


def test_presets_are_complete_configs():
    for name in ("shakespeare-char", "shakespeare-char-fast", "smoke", "gpt2-124m", "seed-400m"):
        cfg = config_from_preset(name)
        cfg.model_config(256)  # the model part validates too
    baby = config_from_preset("shakespeare-char").model_config(65)
    assert (baby.n_layer, baby.n_head, baby.n_embd, baby.block_size) == (4, 4, 128, 64)
    assert config_from_preset("shakespeare-char").batch_size == 12
    assert config_from_preset("smoke").model_config(50304).n_layer == 2


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_run_resumes(tmp_path):
    data = write_text(tmp_path / "text.txt")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "scratchlm", "train", "--data", str(data), "--n_layer", "1", "--n_embd", "32",
           "--block_size", "16", "--batch_size", "4", "--max_steps", "100000", "--log_interval", "1",
           "--eval_interval", "0", "--checkpoint_interval", "100000", "--out_dir", str(run),
           "--data_cache", str(tmp_path / "data"), "--progress", "lines", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("step 5/"):
            break
    os.kill(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, out
    assert "stopped at step" in out and "SIGTERM" in out
    _, _, info = ck.load_model(run)
    stopped_at = info["step"]
    assert stopped_at >= 5
    code = cli_main(["train", "--resume", str(run), "--max_steps", str(stopped_at + 3), "--progress", "quiet"])
    assert code == 0
    assert ck.load_model(run)[2]["step"] == stopped_at + 3


def test_final_validation_loss_covers_the_whole_split(tmp_path):
    """The last evaluation equals a by-hand pass over every window of the validation tokens."""
    from scratchlm.data import read_split

    data = write_text(tmp_path / "text.txt")
    result = train(tiny_config(tmp_path, data, max_steps=3, eval_interval=0))
    model, _, _ = ck.load_model(result.run_dir)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    val = read_split(records[0]["data_dir"], "val")
    T = model.config.block_size
    losses = []
    with torch.no_grad():
        for start in range(0, len(val) - T, T):  # every window of T + 1 tokens, one at a time
            window = torch.tensor(val[start : start + T + 1].astype("int64"))
            logits, _ = model(window[None, :-1])
            losses.append(torch.nn.functional.cross_entropy(logits[0], window[1:], reduction="sum").item())
    assert result.val_loss == pytest.approx(sum(losses) / (len(losses) * T), rel=1e-5)


def test_logged_interval_mean_and_plot_curve_after_resume(tmp_path):
    from scratchlm.training.plot import _curve, read_metrics

    data = write_text(tmp_path / "text.txt")
    result = train(tiny_config(tmp_path, data, max_steps=10, log_interval=5, eval_interval=0))
    records = read_metrics(result.run_dir)
    logged = {r["step"]: r for r in records if r["event"] == "train"}
    assert sorted(logged) == [1, 5, 10]
    assert logged[10]["loss"] == result.losses[10]
    assert logged[10]["loss_mean"] == pytest.approx(sum(result.losses[s] for s in range(6, 11)) / 5)
    assert logged[5]["loss_mean"] == pytest.approx(sum(result.losses[s] for s in range(2, 6)) / 4)
    # a resumed run logs a step again; the later record wins, and a torn last line is skipped
    with open(result.run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"event": "train", "step": 5, "loss": 9.0, "tokens": 1}) + "\n")
        f.write('{"event": "train", "step": 11, "lo')
    steps, tokens, values = _curve(read_metrics(result.run_dir), "train", "loss")
    assert steps == [1, 5, 10] and values[1] == 9.0


def test_a_run_folder_without_a_checkpoint_gets_advice_that_leads_somewhere(tmp_path):
    """A run killed before its first checkpoint leaves a folder with only its logs: --resume has
    nothing to continue, so neither message may send the user to --resume."""
    from scratchlm.training.train import resume_config

    data = write_text(tmp_path / "text.txt")
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "metrics.jsonl").write_text('{"event": "start"}\n')  # what a run writes from its first step
    cfg = tiny_config(tmp_path, data, out_dir=str(stopped))
    with pytest.raises(UserError, match="no checkpoint") as fresh:
        train(cfg)
    assert "--resume" not in str(fresh.value) and "delete it" in str(fresh.value)
    with pytest.raises(UserError, match="no checkpoint to resume from") as resumed:
        resume_config(stopped)
    assert "delete the folder" in str(resumed.value)
    with pytest.raises(UserError, match="no such folder"):
        resume_config(tmp_path / "nowhere")
    assert (stopped / "metrics.jsonl").read_text() == '{"event": "start"}\n'  # nothing was touched
    with pytest.raises(UserError, match="not a run folder"):  # a folder of the user's own: no advice to delete it
        resume_config(tmp_path)


def test_a_reader_that_goes_away_does_not_stop_training(tmp_path):
    """`scratchlm train ... | head -1`: the pipe closes after the first line; training goes on
    quietly, saves its final checkpoint and ends well (it used to die of BrokenPipeError before
    the save)."""
    data = write_text(tmp_path / "text.txt")
    argv = [sys.executable, "-m", "scratchlm", "train", "--data", str(data), "--tokenizer", "char", "--max_steps", "12",
            "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--block_size", "16", "--batch_size", "4",
            "--log_interval", "1", "--eval_interval", "4", "--eval_iters", "1", "--checkpoint_interval", "100",
            "--progress", "lines", "--threads", "1", "--out_dir", str(tmp_path / "run"),
            "--data_cache", str(tmp_path / "data")]
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    _, err = proc.communicate(timeout=240)
    assert first.startswith(b"run ") and proc.returncode == 0, err.decode()
    assert (tmp_path / "run" / "latest").read_text().strip() == "ckpt-00000012"


# ------------------------------------------------------------------------------ one step by hand
# train_step against autograd on a copy of the model: the update plain SGD makes from the mean
# of the micro-batches' losses, clipped as clip_grad_norm_'s rule says (computed here, not by torch).


class _Batches:
    def __init__(self, batches):
        self.batches = list(batches)

    def next_batch(self):
        return self.batches.pop(0)


def _one_step(grad_accum: int, grad_clip: float, scaler=None, poison=False):
    """(model before, model after, batches, what train_step returned) for one SGD step, lr 0.5."""
    import copy

    from scratchlm.model.config import GPTConfig
    from scratchlm.training.distributed import Dist
    from scratchlm.training.train import TrainParts, train_step

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.0))
    before = copy.deepcopy(model)
    batches = [(torch.randint(0, 11, (3, 8)), torch.randint(0, 11, (3, 8))) for _ in range(grad_accum)]
    if poison:  # a finite loss whose gradient is not: the update must be skipped
        model.lm_head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    cfg = TrainConfig(grad_accum=grad_accum, grad_clip=grad_clip)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
    parts = TrainParts(model=model, forward=model, optimizer=optimizer, scaler=scaler, batches=_Batches(batches))
    out = train_step(parts, cfg, Dist(), torch.device("cpu"))
    return before, model, batches, out


def _expected_grads(model, batches):
    losses = [model(x, y)[1] for x, y in batches]
    mean = torch.stack(losses).mean()
    mean.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
    return float(mean.detach()), grads, norm


@pytest.mark.parametrize("grad_accum, grad_clip", [(1, 0.0), (3, 0.0), (3, 1e-2), (2, 1e9)])
def test_one_step_is_sgd_on_the_mean_of_the_micro_batches_clipped_by_hand(grad_accum, grad_clip):
    before, after, batches, (loss, norm, applied) = _one_step(grad_accum, grad_clip)
    mean, grads, true_norm = _expected_grads(before, batches)
    assert applied and loss == pytest.approx(mean, rel=1e-6)
    # the norm is reported before clipping, and only when clipping is on (0 otherwise)
    assert norm == (pytest.approx(true_norm, rel=1e-5) if grad_clip > 0 else 0.0)
    scale = min(1.0, grad_clip / (true_norm + 1e-6)) if grad_clip > 0 else 1.0
    for (name, p0), p1 in zip(before.named_parameters(), after.parameters()):
        torch.testing.assert_close(p1.detach(), p0.detach() - 0.5 * scale * grads[name], rtol=1e-5, atol=1e-6,
                                   msg=name)
    if grad_clip == 1e-2:
        assert scale < 0.1  # the clip really bit


def test_a_step_with_a_non_finite_gradient_is_skipped():
    before, after, _, (loss, norm, applied) = _one_step(1, 1.0, poison=True)
    assert math.isfinite(loss) and not math.isfinite(norm) and not applied
    for p0, p1 in zip(before.parameters(), after.parameters()):
        assert torch.equal(p0, p1)


def test_a_gradient_scaler_unscales_before_clipping_and_backs_off_after_an_overflow():
    """The fp16 path's scaler, on the CPU: the norm clipped and reported is the true gradient's,
    the update equals the unscaled one, and after an infinite gradient the scale halves."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    before, after, batches, (loss, norm, applied) = _one_step(2, 1e9, scaler=scaler)
    mean, grads, true_norm = _expected_grads(before, batches)
    assert applied and norm == pytest.approx(true_norm, rel=1e-5)
    for (name, p0), p1 in zip(before.named_parameters(), after.parameters()):
        torch.testing.assert_close(p1.detach(), p0.detach() - 0.5 * grads[name], rtol=1e-5, atol=1e-6, msg=name)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    before, after, _, (_, _, applied) = _one_step(1, 1.0, scaler=scaler, poison=True)
    assert scaler.get_scale() == 2.0**9  # update() ran and saw the overflow
    for p0, p1 in zip(before.parameters(), after.parameters()):
        assert torch.equal(p0, p1)


def test_learning_rate_shapes_away_from_the_midpoint():
    """Cosine and linear meet at the midpoint; a fifth of the way they differ (hand values)."""
    cosine = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=10)
    linear = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=10, lr_schedule="linear")
    assert learning_rate(2, cosine) == pytest.approx(0.1 + 0.5 * (1 + math.cos(0.2 * math.pi)) * 0.9)  # 0.9141
    assert learning_rate(2, linear) == pytest.approx(1.0 - 0.2 * 0.9)  # 0.82
    # warmup as long as the run: the step after it is already the end, at min_lr
    assert learning_rate(4, TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=4, max_steps=4)) == pytest.approx(0.1)


def test_train_validates_a_config_changed_after_creation_and_sets_its_threads(tmp_path):
    from scratchlm.errors import ConfigError

    data = tmp_path / "t.txt"
    data.write_text("the king speaks. " * 200, encoding="utf-8")
    cfg = tiny_config(tmp_path, data, max_steps=2, eval_interval=0)
    cfg.warmup_steps = -5  # nothing but validate() objects to this one: the run would simply start
    with pytest.raises(ConfigError, match="warmup_steps"):
        train(cfg)
    for name in ("grad_clip", "weight_decay"):  # a negative clip would silently train unclipped
        with pytest.raises(ConfigError, match=f"{name}: must be >= 0"):
            tiny_config(tmp_path, data, **{name: -1.0}).validate()
    threads = torch.get_num_threads()
    seen = []
    torch.set_num_threads(2)
    try:
        train(tiny_config(tmp_path, data, max_steps=2, eval_interval=0, threads=1, out_dir=str(tmp_path / "t1")),
              on_step=lambda step, record: seen.append(torch.get_num_threads()))
    finally:
        torch.set_num_threads(threads)
    assert seen == [1, 1]
