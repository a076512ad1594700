"""The chunked lm_head + cross-entropy against the plain F.linear + F.cross_entropy path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scratchlm.model.config import GPTConfig
from scratchlm.model.fused_loss import linear_cross_entropy
from scratchlm.model.gpt import GPT


def _inputs(N=37, C=12, V=53, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, C, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(V, C, generator=g, dtype=dtype) * 0.5).requires_grad_()
    b = (torch.randn(V, generator=g, dtype=dtype) * 0.5).requires_grad_() if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    return h, w, b, y


def _grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("chunk_rows", [1, 8, 37, 1000])
def test_values_and_gradients_match_the_plain_path(dtype, atol, bias, chunk_rows):
    h, w, b, y = _inputs(dtype=dtype, bias=bias)
    y[::5] = -100  # some padding rows, left out of the mean
    plain = F.cross_entropy(F.linear(h, w, b), y)
    fused = linear_cross_entropy(h, w, b, y, chunk_rows=chunk_rows)
    assert fused.dtype == plain.dtype
    torch.testing.assert_close(fused, plain, atol=atol, rtol=0)
    # a scale on the loss (as grad_accum applies) must reach every gradient
    for got, want in zip(_grads(2.5 * fused, (h, w, b)), _grads(2.5 * plain, (h, w, b))):
        torch.testing.assert_close(got, want, atol=atol, rtol=0)


def test_other_ignore_index_and_leading_dims():
    h, w, b, y = _inputs(N=24)
    y[3:9] = 7  # class 7 is the padding id here, so those rows are ignored
    h3, y3 = h.view(2, 12, -1), y.view(2, 12)  # (B, T, C), (B, T)
    plain = F.cross_entropy(F.linear(h, w, b), y, ignore_index=7)
    fused = linear_cross_entropy(h3, w, b, y3, ignore_index=7, chunk_rows=5)
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=0)
    for got, want in zip(_grads(fused, (h, w, b)), _grads(plain, (h, w, b))):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_all_rows_ignored_gives_nan_and_zero_gradients_like_cross_entropy():
    h, w, b, y = _inputs(N=6)
    y[:] = -100
    plain = F.cross_entropy(F.linear(h, w, b), y)
    fused = linear_cross_entropy(h, w, b, y, chunk_rows=4)
    assert torch.isnan(plain) and torch.isnan(fused)
    for got, want in zip(_grads(fused, (h, w, b)), _grads(plain, (h, w, b))):
        torch.testing.assert_close(got, want)


def test_hand_computed_loss():
    # two classes, one row: scores (1, 0) against class 1 -> log(e + 1) - 0
    h = torch.tensor([[1.0]])
    w = torch.tensor([[1.0], [0.0]])
    loss = linear_cross_entropy(h, w, None, torch.tensor([1]))
    assert abs(loss.item() - 1.3132616875182228) < 1e-6


def test_no_grad_builds_no_graph():
    h, w, b, y = _inputs()
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, b, y, chunk_rows=8)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(h, w, b), y).detach(), atol=1e-5, rtol=0)


BF16_GRAD_TOLERANCE = 0.05
"""Largest |fused - reference| / max |reference| of a gradient under bfloat16 autocast."""


def test_bf16_autocast_is_close_to_float32_on_rounded_inputs():
    h, w, b, y = _inputs(N=40, C=16, V=70)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, b, y, chunk_rows=16)
    assert fused.dtype == torch.float32
    # the same scores from bf16-rounded operands in float32: only the matmul's output rounding differs
    r = lambda t: t.detach().bfloat16().float().requires_grad_()  # noqa: E731
    hr, wr, br = r(h), r(w), r(b)
    ref = F.cross_entropy(F.linear(hr, wr, br), y)
    # 6e-4 measured here; the scores' log-softmax in bfloat16 (3.5e-3) or no bfloat16 at all
    # (2.2e-3, the unrounded operands) fall outside (mutate.py: fused_loss L33, L34, L65)
    torch.testing.assert_close(fused, ref, atol=1.5e-3, rtol=0)
    for got, want in zip(_grads(fused, (h, w, b)), _grads(ref, (hr, wr, br))):
        assert got.dtype == torch.float32
        # the tolerance scales with the gradient itself (MUTATION, issue 21: an absolute 2e-2 sat
        # above these gradients' size, about 0.012, so dh scaled by 0.75 passed)
        err = float((got - want).abs().max() / want.abs().max())
        assert err < BF16_GRAD_TOLERANCE, err


TINY = dict(vocab_size=61, block_size=16, n_layer=1, n_head=2, n_embd=16)


@pytest.mark.parametrize("preset, extra", [
    ("smoke", {}),  # untied head with a bias (the seed's layout)
    ("gpt2-124m", {}),  # tied head without bias: the gradient of wte gets both uses
    ("smoke", {"tie_weights": True}),  # tied with a bias
])
def test_model_loss_only_matches_logits_path(preset, extra, monkeypatch):
    from scratchlm.model import gpt as model_module

    monkeypatch.setattr(model_module, "FUSED_LOSS_MIN_SCORES", 0)  # the fused path at this tiny size
    calls = []
    fused_fn = model_module.linear_cross_entropy
    monkeypatch.setattr(model_module, "linear_cross_entropy", lambda *a, **k: calls.append(1) or fused_fn(*a, **k))
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name(preset, **TINY, **extra)).train()
    idx = torch.randint(0, 61, (3, 16))
    targets = torch.randint(0, 61, (3, 16))
    targets[0, :4] = -1
    logits, plain = model(idx, targets, ignore_index=-1)
    want = _grads(plain, list(model.parameters()))
    none, fused = model(idx, targets, ignore_index=-1, return_logits=False)
    got = _grads(fused, list(model.parameters()))
    assert none is None and logits.shape == (3, 16, 61) and calls == [1]
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=0)
    names = [n for n, _ in model.named_parameters()]
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("threshold, fused", [(3 * 16 * 61, True), (3 * 16 * 61 + 1, False)])
def test_the_fused_path_is_taken_from_the_threshold_on(threshold, fused, monkeypatch):
    """return_logits=False takes the chunked path from FUSED_LOSS_MIN_SCORES scores (rows x V) on
    and the plain one below; both give the loss of the logits' cross-entropy."""
    from scratchlm.model import gpt as model_module

    monkeypatch.setattr(model_module, "FUSED_LOSS_MIN_SCORES", threshold)
    calls = []
    fused_fn = model_module.linear_cross_entropy
    monkeypatch.setattr(model_module, "linear_cross_entropy", lambda *a, **k: calls.append(1) or fused_fn(*a, **k))
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("smoke", **TINY)).train()
    idx, targets = torch.randint(0, 61, (3, 16)), torch.randint(0, 61, (3, 16))
    logits, _ = model(idx)
    _, loss = model(idx, targets, return_logits=False)
    assert len(calls) == fused
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 61), targets.reshape(-1)), atol=1e-5, rtol=0)


def test_the_default_threshold_sends_characters_plain_and_bpe_fused():
    """The rule as documented: the shakespeare-char preset's micro-batch, with any vocabulary of
    up to 256 characters, on the plain path; the smoke preset's with an 8192-token BPE
    vocabulary, and the smoke shape with GPT-2's, on the fused one."""
    from scratchlm.model.gpt import FUSED_LOSS_MIN_SCORES
    from scratchlm.training.train import config_from_preset

    char, smoke = config_from_preset("shakespeare-char"), config_from_preset("smoke")
    assert char.batch_size * char.model_config(256).block_size * 256 < FUSED_LOSS_MIN_SCORES
    assert smoke.batch_size * smoke.model_config(8192).block_size * 8192 >= FUSED_LOSS_MIN_SCORES
    assert 8 * 256 * 50304 >= FUSED_LOSS_MIN_SCORES


def test_loss_only_needs_targets():
    model = GPT(GPTConfig.from_name("smoke", **TINY))
    with pytest.raises(ValueError, match="needs targets"):
        model(torch.zeros(1, 4, dtype=torch.long), return_logits=False)


def test_training_with_and_without_fused_loss_gives_the_same_losses(tmp_path, monkeypatch):
    from scratchlm.training.train import TrainConfig, train

    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path / "cache"))  # the CPU FLOP probe's file
    words = "the king speaks to the queen of night and day".split()
    (tmp_path / "text.txt").write_text("\n".join(" ".join(words[i:] + words[:i]) for i in range(60)) + "\n")
    threads = torch.get_num_threads()
    from scratchlm.model import gpt as model_module

    calls = {True: 0, False: 0}
    current = [None]
    fused_fn = model_module.linear_cross_entropy

    def counted(*args, **kwargs):
        calls[current[0]] += torch.is_grad_enabled()  # training steps only (evaluation may use it too)
        return fused_fn(*args, **kwargs)

    monkeypatch.setattr(model_module, "linear_cross_entropy", counted)
    monkeypatch.setattr(model_module, "FUSED_LOSS_MIN_SCORES", 0)  # this tiny model would take the plain path
    runs = {}
    try:
        for fused in (True, False):
            current[0] = fused
            cfg = TrainConfig(
                data=str(tmp_path / "text.txt"), tokenizer="char", batch_size=4, max_steps=6, lr=3e-3,
                warmup_steps=2, eval_interval=3, eval_iters=2, log_interval=1, checkpoint_interval=100,
                sample_tokens=0, progress="quiet", out_dir=str(tmp_path / f"run-{fused}"),
                data_cache=str(tmp_path / "data"), threads=1, fused_loss=fused,
                model_overrides=dict(n_layer=1, n_head=2, n_embd=16, block_size=16, dropout=0.0),
            )
            runs[fused] = train(cfg)
    finally:
        torch.set_num_threads(threads)
    # the flag switches paths (MUTATION, issue 21: the flag ignored compared the fused path with
    # itself and passed): six training steps through the fused loss, none without it
    assert calls == {True: 6, False: 0}
    assert runs[True].losses.keys() == runs[False].losses.keys()
    for step, loss in runs[False].losses.items():
        assert abs(runs[True].losses[step] - loss) < 1e-4, step
    assert abs(runs[True].val_loss - runs[False].val_loss) < 1e-4


def test_autocast_decides_the_compute_dtype():
    from scratchlm.model.fused_loss import _compute_dtype

    h, w, b, y = _inputs(N=40, C=16, V=70)
    assert _compute_dtype(h) == torch.float32 and _compute_dtype(h.double()) == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _compute_dtype(h) == torch.bfloat16
        assert _compute_dtype(h.double()) == torch.float64  # autocast leaves float64 alone, as a Linear does
        in_bf16 = linear_cross_entropy(h, w, b, y)
    assert in_bf16.item() != linear_cross_entropy(h, w, b, y).item()


def test_one_valid_row_gets_the_whole_gradient():
    """Every row ignored but one: the mean is over one row, so its gradient is not halved or
    thinned (the divisor's floor of 1 only guards an all-ignored batch)."""
    h, w, b, y = _inputs(N=9, C=8, V=20)
    y[1:] = -100
    fused, plain = linear_cross_entropy(h, w, b, y, chunk_rows=4), F.cross_entropy(F.linear(h, w, b), y)
    torch.testing.assert_close(fused, plain)
    for got, want in zip(_grads(fused, (h, w, b)), _grads(plain, (h, w, b))):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("frozen", ["h", "weight", "bias"])
def test_gradients_reach_only_what_wants_them(frozen):
    """One input frozen (a fine-tune freezing the head, or the hidden states): the others get
    the plain path's gradients, the frozen one none."""
    h, w, b, y = _inputs(N=21, C=8, V=30)
    tensors = {"h": h, "weight": w, "bias": b}
    tensors[frozen] = tensors[frozen].detach()
    live = [t for name, t in tensors.items() if name != frozen]
    fused = linear_cross_entropy(tensors["h"], tensors["weight"], tensors["bias"], y, chunk_rows=8)
    plain = F.cross_entropy(F.linear(tensors["h"], tensors["weight"], tensors["bias"]), y)
    for got, want in zip(torch.autograd.grad(fused, live), torch.autograd.grad(plain, live)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("split", [1, 40, 52])
def test_a_weight_in_row_blocks_gives_the_whole_matrixs_loss_and_gradients(bias, split):
    """A head kept as frozen rows and trainable new ones (a LoRA fine-tune's, model/lora.py): the
    loss and the gradients of h and of the new rows are the plain path's on the stacked matrix,
    and the frozen block gets none."""
    h, w, b, y = _inputs(bias=bias)
    y[::7] = -100
    old, new = w.detach()[:split], w.detach()[split:].clone().requires_grad_()
    b = None if b is None else b.detach()  # a frozen bias, as a fine-tune's base holds it
    fused = linear_cross_entropy(h, (old, new), b, y, chunk_rows=8)
    stacked = torch.cat([old, w.detach()[split:].clone().requires_grad_()])
    plain = F.cross_entropy(F.linear(h, stacked, b), y)
    torch.testing.assert_close(fused, plain)
    got_h, got_new = torch.autograd.grad(fused, (h, new))
    want_h, want_w = torch.autograd.grad(plain, (h, stacked))
    torch.testing.assert_close(got_h, want_h, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_new, want_w[split:], atol=1e-6, rtol=1e-5)


def test_row_blocks_under_bf16_autocast_are_close_to_float32_on_rounded_inputs():
    """A LoRA fine-tune's head (frozen rows and bias, new rows) under bfloat16 autocast, as `--dtype
    auto` trains it on a CPU with bfloat16 units: the loss and the gradients of h and the new rows
    are those of the stacked matrix from bf16-rounded operands in float32, to the whole matrix's
    tolerances (the inputs of test_bf16_autocast_is_close_to_float32_on_rounded_inputs)."""
    h, w, b, y = _inputs(N=40, C=16, V=70)
    old, new, b = w.detach()[:64], w.detach()[64:].clone().requires_grad_(), b.detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, (old, new), b, y, chunk_rows=16)
    assert fused.dtype == torch.float32
    r = lambda t: t.detach().bfloat16().float().requires_grad_()  # noqa: E731
    hr, wr, br = r(h), r(w), r(b)
    ref = F.cross_entropy(F.linear(hr, wr, br), y)
    torch.testing.assert_close(fused, ref, atol=1.5e-3, rtol=0)
    (got_h, got_new), (want_h, want_w) = _grads(fused, (h, new)), _grads(ref, (hr, wr))
    for got, want in ((got_h, want_h), (got_new, want_w[64:])):
        assert got.dtype == torch.float32
        err = float((got - want).abs().max() / want.abs().max())
        assert err < BF16_GRAD_TOLERANCE, err


def test_a_frozen_block_has_no_gradient_matrix_made_or_kept():
    """What backward keeps for a head of 50 frozen rows and 3 trained ones: the (N, C) gradient
    of h and the trained block's (C, 3), never a (C, 50) or (C, 53) one."""
    h, w, _, y = _inputs(N=16, C=12, V=53, bias=False)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        linear_cross_entropy(h, (w.detach()[:50], w.detach()[50:].requires_grad_()), None, y)
    assert sorted(saved) == [(12, 3), (16, 12)]
