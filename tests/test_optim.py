"""--optimizer muon: which parameters go where, Muon's step against a NumPy computation, the AdamW
half against a plain torch AdamW, state round trips, gradient scaling, training and exact resume."""

from __future__ import annotations

import copy
import io
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from scratchlm.cli.main import main as cli_main
from scratchlm.errors import ConfigError, UserError
from scratchlm.model.gpt import GPT
from scratchlm import checkpoint as ck
from scratchlm.training.optim import MuonWithAdamW
from scratchlm.training.train import TrainConfig, make_optimizer, train
from helpers import assert_same_weights, write_text  # the same small corpus

CPU = torch.device("cpu")
TINY_MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0)


@pytest.fixture(autouse=True)
def _quiet_machine(tmp_path_factory, monkeypatch, one_torch_thread):
    # the CPU FLOP probe and prepared data go to a per-session folder, not the user's home
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    yield


def muon_config(**overrides) -> TrainConfig:
    model_overrides = {**TINY_MODEL, **overrides.pop("model_overrides", {})}
    return TrainConfig(optimizer="muon", model_overrides=model_overrides, **overrides)


def tiny_model(cfg: TrainConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg.model_config(40))


def random_grads(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


# --------------------------------------------------------------------------------------------
# The split
# --------------------------------------------------------------------------------------------

VARIANTS = {
    "untied, biases on": dict(),
    "tied, GPT-2 biases": dict(tie_weights=True, qkv_bias=True, lm_head_bias=False),
    "swiglu, rmsnorm, rope, no biases": dict(activation="swiglu", norm="rmsnorm", pos_embedding="rope",
                                             mlp_bias=False, proj_bias=False, lm_head_bias=False),
    "tied, sinusoidal, post-norm": dict(tie_weights=True, pos_embedding="sinusoidal", norm_position="post"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_muon_takes_exactly_the_blocks_matrices(variant):
    cfg = muon_config(model_overrides=VARIANTS[variant])
    model = tiny_model(cfg)
    opt = make_optimizer(model, cfg, CPU)
    assert isinstance(opt, MuonWithAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in opt.muon.param_groups for p in g["params"]]
    adamw = [names[id(p)] for g in opt.adamw.param_groups for p in g["params"]]
    # by hand, from the names: the four linear weights of every block (GPT-2 names)
    expected = [f"transformer.h.{i}.{m}.weight" for i in range(cfg.model_config(40).n_layer)
                for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert sorted(muon) == sorted(expected)
    assert sorted(muon) == sorted(n for n, p in model.named_parameters()
                                  if re.match(r"transformer\.h\.\d+\.", n) and p.dim() == 2)
    # everything else once, in AdamW: a tied matrix is one parameter (named transformer.wte.weight)
    assert sorted(muon + adamw) == sorted(names.values())
    assert len(set(muon + adamw)) == len(muon) + len(adamw)
    assert "transformer.wte.weight" in adamw
    assert ("lm_head.weight" in adamw) == (not cfg.model_config(40).tie_weights)
    # AdamW keeps make_optimizer's split: decay on its matrices, none on vectors
    decayed = {names[id(p)] for g in opt.adamw.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {n for n in adamw if dict(model.named_parameters())[n].dim() == 2}
    group = opt.muon.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["momentum"], group["nesterov"], group["adjust_lr_fn"]) == (
        cfg.lr, cfg.weight_decay, cfg.muon_momentum, True, "match_rms_adamw")


def test_split_sees_through_ddp(tmp_path):
    """Under torchrun the loop passes the DistributedDataParallel wrapper, whose parameter names
    start with `module.`: the same matrices still go to Muon (a 1-process gloo group here)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = muon_config()
    model = tiny_model(cfg)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        opt = make_optimizer(DDP(model), cfg, CPU)
    finally:
        dist.destroy_process_group()
    names = {id(p): n for n, p in model.named_parameters()}
    muon = sorted(names[id(p)] for g in opt.muon.param_groups for p in g["params"])
    assert muon == sorted(n for n, p in model.named_parameters() if n.startswith("transformer.h.") and p.dim() == 2)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(names)


def test_adamw_is_still_the_default():
    cfg = TrainConfig(model_overrides=TINY_MODEL)
    assert cfg.optimizer == "adamw"
    assert isinstance(make_optimizer(tiny_model(cfg), cfg, CPU), torch.optim.AdamW)


# --------------------------------------------------------------------------------------------
# One Muon step, by hand
# --------------------------------------------------------------------------------------------

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalise(m: np.ndarray) -> np.ndarray:
    """The quintic Newton-Schulz iteration in float64: 5 steps from M / ||M||_F, on the wide
    orientation (X X^T is the smaller Gram matrix). Drives every singular value towards ~1."""
    a, b, c = NS_COEFFICIENTS
    tall = m.shape[0] > m.shape[1]
    x = m.T if tall else m
    x = x / np.linalg.norm(x)
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def muon_by_hand(w0: np.ndarray, grads: list[np.ndarray], lr: float, wd: float, mu: float, *,
                 nesterov: bool = True, rms_scale: bool = True, decay: bool = True) -> np.ndarray:
    """torch.optim.Muon's update written out: an averaged momentum buffer, its Nesterov look-ahead,
    orthogonalised; decoupled weight decay lr * wd; the step scaled by 0.2 * sqrt(max(rows, cols))
    to match AdamW's update RMS."""
    w, buf = w0.copy(), np.zeros_like(w0)
    for g in grads:
        buf = mu * buf + (1 - mu) * g
        update = (1 - mu) * g + mu * buf if nesterov else buf
        scale = 0.2 * math.sqrt(max(w.shape)) if rms_scale else 1.0
        w = w * (1 - lr * wd if decay else 1.0) - lr * scale * orthogonalise(update)
    return w


@pytest.mark.parametrize("shape", [(16, 64), (64, 16)])
def test_muon_steps_match_a_numpy_computation(shape):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(shape)
    grads = [rng.standard_normal(shape) for _ in range(2)]  # two steps: the momentum buffer counts
    lr, wd, mu = 0.02, 0.1, 0.9
    cfg = TrainConfig(optimizer="muon", lr=lr, weight_decay=wd, muon_momentum=mu)
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float32))
    model = torch.nn.Module()  # make_optimizer's own Muon, on a one-matrix "model"
    model.transformer = torch.nn.Module()
    model.transformer.h = torch.nn.ParameterList([p])
    opt = make_optimizer(model, cfg, CPU)
    assert [q for g in opt.muon.param_groups for q in g["params"]] == [p]
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    change = p.detach().double().numpy() - w0
    expected = muon_by_hand(w0, grads, lr, wd, mu) - w0

    def distance(w: np.ndarray) -> float:
        return float(np.linalg.norm(change - (w - w0)) / np.linalg.norm(expected))

    # In bfloat16 (torch's choice, and ours where this CPU has bfloat16 units) the iterations carry
    # 8 bits of mantissa: about 1% off the float64 result here. In float32 (a CPU without them)
    # they carry 24: the float32 sums of the update are the rest.
    tolerance = 0.03 if opt.muon.ns_dtype == torch.bfloat16 else 1e-4
    assert distance(muon_by_hand(w0, grads, lr, wd, mu)) < tolerance
    # ... yet each plausible mistake lands far outside that tolerance
    assert distance(muon_by_hand(w0, grads, lr, wd, mu, rms_scale=False)) > 5 * tolerance
    assert distance(muon_by_hand(w0, grads, lr, wd, mu, decay=False)) > 5 * tolerance
    assert distance(muon_by_hand(w0, grads, lr, wd, mu, nesterov=False)) > 5 * tolerance
    assert distance(muon_by_hand(w0, grads, 2 * lr, wd, mu)) > 5 * tolerance


def test_muon_in_bfloat16_is_torchs_muon_step_for_step():
    """scratchlm.training.optim.Muon with bfloat16 iterations against torch.optim.Muon itself (which always
    uses bfloat16): bit for bit over three steps, both orientations, with and without Nesterov."""
    from scratchlm.training.optim import Muon

    for shape, nesterov in [((16, 40), True), ((40, 16), False)]:
        g = torch.Generator().manual_seed(3)
        w0 = torch.randn(shape, generator=g)
        ours, theirs = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
        options = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn="match_rms_adamw")
        a = Muon([ours], ns_dtype=torch.bfloat16, **options)
        b = torch.optim.Muon([theirs], **options)
        for _ in range(3):
            grad = torch.randn(shape, generator=g)
            ours.grad, theirs.grad = grad.clone(), grad.clone()
            a.step(), b.step()
            assert torch.equal(ours, theirs)


def test_float32_iterations_are_closer_to_float64_than_bfloat16_ones():
    """The float32 path is the same polynomial with more bits: within 1e-5 of NumPy's float64
    iteration where the bfloat16 one is about 1e-2 away."""
    from scratchlm.training.optim import orthogonalize

    rng = np.random.default_rng(4)
    for shape in [(24, 64), (64, 24)]:
        m = rng.standard_normal(shape)
        exact = orthogonalise(m)
        near = orthogonalize(torch.tensor(m, dtype=torch.float32), NS_COEFFICIENTS, 5, 1e-7, torch.float32)
        coarse = orthogonalize(torch.tensor(m, dtype=torch.float32), NS_COEFFICIENTS, 5, 1e-7, torch.bfloat16)
        size = np.linalg.norm(exact)
        assert np.linalg.norm(near.double().numpy() - exact) / size < 1e-5
        assert np.linalg.norm(coarse.double().numpy() - exact) / size > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matrices_of_one_shape_orthogonalised_together_are_each_as_alone(dtype):
    """Muon stacks same-shape matrices into one batched iteration: every matrix of the stack comes
    out as it does alone (float32: to float32 rounding; bfloat16: to a bfloat16 step), and a
    Muon step over four such parameters moves each as torch.optim.Muon moves it alone."""
    from scratchlm.training.optim import Muon, orthogonalize

    g = torch.Generator().manual_seed(5)
    for shape in [(3, 16, 40), (3, 40, 16)]:
        stack = torch.randn(shape, generator=g)
        together = orthogonalize(stack, NS_COEFFICIENTS, 5, 1e-7, dtype).float()
        alone = torch.stack([orthogonalize(m, NS_COEFFICIENTS, 5, 1e-7, dtype) for m in stack]).float()
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        assert (together - alone).abs().max() <= tolerance * alone.abs().max()
    weights = [torch.randn(24, 8, generator=g) for _ in range(4)]
    ours = [torch.nn.Parameter(w.clone()) for w in weights]
    options = dict(lr=0.02, weight_decay=0.1, momentum=0.9, adjust_lr_fn="match_rms_adamw")
    opt = Muon(ours, ns_dtype=dtype, **options)
    grads = [torch.randn(24, 8, generator=g) for _ in range(4)]
    for p, grad in zip(ours, grads):
        p.grad = grad.clone()
    opt.step()
    for w, p, grad in zip(weights, ours, grads):
        alone = torch.nn.Parameter(w.clone())
        single = Muon([alone], ns_dtype=dtype, **options)
        alone.grad = grad.clone()
        single.step()
        step_size = (alone - w).abs().max()
        assert (p - alone).abs().max() <= (1e-5 if dtype == torch.float32 else 3e-2) * step_size


def test_newton_schulz_dtype_follows_the_cpu(monkeypatch):
    """bfloat16 only where this CPU multiplies it natively; SCRATCHLM_CPU_BF16=0 makes any CPU
    behave as one without (and =1 as one with); make_optimizer's Muon uses the same choice."""
    from scratchlm.machine import cpu
    from scratchlm.training.optim import newton_schulz_dtype

    assert newton_schulz_dtype(CPU) == (torch.bfloat16 if cpu.native_bf16() else torch.float32)
    cfg = TrainConfig(optimizer="muon")
    model = torch.nn.Module()
    model.transformer = torch.nn.Module()
    model.transformer.h = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(8, 8))])
    for value, want in [("0", torch.float32), ("1", torch.bfloat16)]:
        monkeypatch.setenv("SCRATCHLM_CPU_BF16", value)
        assert newton_schulz_dtype(CPU) == want
        assert make_optimizer(model, cfg, CPU).muon.ns_dtype == want
    monkeypatch.delenv("SCRATCHLM_CPU_BF16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")  # oneDNN told to emulate bfloat16
    if cpu.is_x86():
        assert newton_schulz_dtype(CPU) == torch.float32


def test_muon_update_has_its_singular_values_near_one():
    """What makes Muon Muon: a gradient whose singular values span 20x becomes an update whose
    singular values all lie near 1 (torch's quintic keeps them within about 0.7..1.15, on purpose:
    a faster iteration that does not converge exactly)."""
    rng = np.random.default_rng(1)
    m, n = 24, 48
    u, _ = np.linalg.qr(rng.standard_normal((m, m)))
    v, _ = np.linalg.qr(rng.standard_normal((n, m)))
    spread = np.geomspace(1.0, 1 / 20, m)
    grad = (u * spread) @ v.T  # (m, n), singular values `spread`
    w0 = rng.standard_normal((m, n))
    lr = 0.01
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float32))
    opt = torch.optim.Muon([p], lr=lr, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
    p.grad = torch.tensor(grad, dtype=torch.float32)
    opt.step()
    applied = (w0 - p.detach().double().numpy()) / (lr * 0.2 * math.sqrt(n))
    sv = np.linalg.svd(applied, compute_uv=False)
    assert 0.5 < sv.min() and sv.max() < 1.5
    assert sv.max() / sv.min() < 2.0  # from 20
    # and the directions are the gradient's: the same singular vectors as U V^T
    assert np.linalg.norm(applied - u @ v.T) / np.linalg.norm(u @ v.T) < 0.3


# --------------------------------------------------------------------------------------------
# The AdamW half, state, gradient scaling
# --------------------------------------------------------------------------------------------


def test_adamw_half_equals_a_plain_adamw():
    cfg = muon_config(lr=1e-2, weight_decay=0.1, beta1=0.8, beta2=0.95)
    model = tiny_model(cfg)
    twin = copy.deepcopy(model)
    opt = make_optimizer(model, cfg, CPU)
    muon_names = {n for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("transformer.h.")}
    rest = [(n, p) for n, p in twin.named_parameters() if n not in muon_names]
    plain = torch.optim.AdamW([
        {"params": [p for _, p in rest if p.dim() == 2], "weight_decay": 0.1},
        {"params": [p for _, p in rest if p.dim() < 2], "weight_decay": 0.0},
    ], lr=1e-2, betas=(0.8, 0.95), foreach=False)
    for step, lr in enumerate([3e-3, 7e-3, 1e-2]):
        for group in opt.param_groups:  # the loop's way of setting the schedule's lr
            group["lr"] = lr
        for group in plain.param_groups:
            group["lr"] = lr
        random_grads(model, seed=step)
        random_grads(twin, seed=step)
        opt.step()
        plain.step()
        opt.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
    assert opt.muon.param_groups[0]["lr"] == 1e-2  # the lr reached Muon's group too
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        if name in muon_names:
            assert not torch.allclose(a, b), name  # Muon moved these, differently from AdamW
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
        assert a.grad is None


def test_state_dict_round_trip_continues_identically():
    cfg = muon_config(lr=1e-2)
    model = tiny_model(cfg)
    opt = make_optimizer(model, cfg, CPU)
    for step in range(2):
        random_grads(model, seed=step)
        opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)  # as checkpoints keep it
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert set(saved) == {"muon", "adamw"} and len(saved["muon"]["state"]) == 8  # a buffer per matrix

    twin = copy.deepcopy(model)
    other = make_optimizer(twin, cfg, CPU)
    other.load_state_dict(saved)
    for step in range(2, 4):
        random_grads(model, seed=step)
        random_grads(twin, seed=step)
        opt.step()
        other.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="muon"):  # a plain AdamW state is not taken for half of one
        make_optimizer(copy.deepcopy(twin), cfg, CPU).load_state_dict(saved["adamw"])


def test_grad_scaler_unscales_and_skips_both_halves():
    """GradScaler drives the pair through param_groups and step(): the same update as unscaled
    gradients (the scale is a power of two, so unscaling is exact), and no update on an inf."""
    cfg = muon_config(lr=1e-2)
    model = tiny_model(cfg)
    twin = copy.deepcopy(model)
    opt, plain = make_optimizer(model, cfg, CPU), make_optimizer(twin, cfg, CPU)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    x = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    _, loss = model(x, x)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    _, loss = twin(x, x)
    loss.backward()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a.grad, b.grad), name
    scaler.step(opt)
    scaler.update()
    plain.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name

    opt.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in model.parameters()]
    _, loss = model(x, x)
    scaler.scale(loss).backward()
    next(model.transformer.h[0].parameters()).grad[0] = float("inf")  # a norm gain of block 0
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    assert scaler.get_scale() == 2.0**9  # the scaler backed off


# --------------------------------------------------------------------------------------------
# Through train(): learning, exact resume
# --------------------------------------------------------------------------------------------


def run_config(tmp_path: Path, data: Path, **overrides) -> TrainConfig:
    values = dict(
        data=str(data), tokenizer="char", batch_size=4, max_steps=20, lr=3e-3, min_lr=3e-4, warmup_steps=3,
        eval_interval=0, eval_iters=2, log_interval=1, checkpoint_interval=100, sample_tokens=0,
        progress="quiet", out_dir=str(tmp_path / "run"), data_cache=str(tmp_path / "data"), threads=1,
        optimizer="muon", model_overrides={**TINY_MODEL, "dropout": 0.1},
    )
    values.update(overrides)
    return TrainConfig(**values)


def test_muon_trains_and_resumes_exactly(tmp_path):
    """20 steps straight == 10 steps, a stop (checkpoint), a resume and 10 more, with Muon."""
    data = write_text(tmp_path / "text.txt")
    straight = train(run_config(tmp_path, data, out_dir=str(tmp_path / "a")))
    first_five = sum(straight.losses[s] for s in range(1, 6)) / 5
    last_five = sum(straight.losses[s] for s in range(16, 21)) / 5
    assert last_five < first_five - 0.5  # from ~3.3 (uniform over the characters) downwards

    first = train(run_config(tmp_path, data, out_dir=str(tmp_path / "b")), on_step=lambda step, record: step == 10)
    assert first.stopped and first.step == 10
    second = train(run_config(tmp_path, data, out_dir=None, resume=str(tmp_path / "b")))
    assert {**first.losses, **second.losses} == straight.losses  # exact, step by step
    assert_same_weights(tmp_path / "a", tmp_path / "b")

    # the saved Muon state cannot continue as AdamW (nor the other way round)
    with pytest.raises(UserError, match="--optimizer muon"):
        train(run_config(tmp_path, data, out_dir=None, resume=str(tmp_path / "b"), optimizer="adamw", max_steps=30))


# --------------------------------------------------------------------------------------------
# Config and command line
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values, words", [
    (dict(optimizer="sgd"), ["optimizer", "'sgd'", "adamw, muon"]),
    (dict(optimizer="muon", muon_momentum=1.0), ["muon_momentum", "[0, 1)"]),
    (dict(muon_momentum=-0.1), ["muon_momentum"]),
    (dict(optimizer="muon", fsdp=True), ["FSDP shards them", "--optimizer adamw with --fsdp"]),
])
def test_bad_optimizer_settings(values, words):
    with pytest.raises(ConfigError) as caught:
        TrainConfig(**values)
    for word in words:
        assert word in str(caught.value)
    TrainConfig(optimizer="muon", muon_momentum=0.0)  # the edges that are allowed
    TrainConfig(optimizer="adamw", fsdp=True)


def test_cli_flags_and_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--optimizer STR" in text and "`adamw`, or `muon`" in text and "(default: adamw)" in text
    assert "--muon_momentum FLOAT" in text and "(default: 0.95)" in text

    code = cli_main(["train", "--optimizer", "muon", "--muon_momentum", "0.9", "--show-config"])
    assert code == 0
    shown = capsys.readouterr().out
    assert '"optimizer": "muon"' in shown and '"muon_momentum": 0.9' in shown

    for args, word in ((["--optimizer", "lion"], "lion"), (["--optimizer", "muon", "--fsdp"], "FSDP"),
                       (["--muon_momentum", "1.5"], "muon_momentum")):
        code = cli_main(["train", *args, "--show-config"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and word in err[0], (args, err)
