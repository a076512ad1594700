"""The NumPy backward pass and AdamW step (scratchlm/reference/numpy_backward.py), written out by
hand, against torch autograd and torch.optim.AdamW in float64: every parameter's gradient, over
every variant the twin has, and one optimizer step as scratchlm's training makes it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scratchlm.reference import numpy_backward as back
from scratchlm.reference import numpy_gpt as ref
from helpers import VARIANTS, ids_and_targets, perturbed_model, variant_config, variant_id

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _torch_grads(model, ids, targets) -> dict[str, np.ndarray]:
    model.zero_grad()
    _, loss = model(ids, targets)
    loss.backward()
    return {n: p.grad.numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_every_gradient_equals_torch_autograd(variant):
    model = perturbed_model(variant_config(*variant), torch.float64)
    ids, targets = ids_and_targets()
    want = _torch_grads(model, ids, targets)
    params = ref.params_from_state_dict(model.state_dict())
    if model.config.tie_weights:
        params.pop("lm_head.weight")  # the twin's convention: a missing head means the tied table
    trace = ref.forward_trace(ids.numpy(), params, model.config, targets=targets.numpy())
    got = back.gpt_backward(trace, params, model.config, targets.numpy())
    assert set(got) == set(want)
    for name, grad in want.items():
        assert np.abs(grad).max() > 1e-6, name  # every parameter really takes part
        np.testing.assert_allclose(got[name], grad, rtol=0, atol=1e-12, err_msg=name)


def test_gradient_equals_finite_differences():
    """An independent judge besides autograd: central differences of the NumPy loss itself."""
    model = perturbed_model(variant_config("rope", "rmsnorm", "swiglu", "post", True, "bias"), torch.float64)
    ids, targets = ids_and_targets(3)
    params = ref.params_from_state_dict(model.state_dict())
    params.pop("lm_head.weight")
    cfg = model.config
    grads = back.gpt_backward(ref.forward_trace(ids.numpy(), params, cfg), params, cfg, targets.numpy())
    rng = np.random.default_rng(0)
    for name in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.1.ln_2.weight",
                 "transformer.h.0.mlp.c_fc.bias", "lm_head.bias"):
        index = tuple(rng.integers(0, n) for n in params[name].shape)
        h, saved = 1e-6, params[name][index]
        losses = []
        for sign in (1, -1):
            params[name][index] = saved + sign * h
            losses.append(float(ref.cross_entropy(ref.gpt_forward(ids.numpy(), params, cfg), targets.numpy())))
        params[name][index] = saved
        assert abs((losses[0] - losses[1]) / (2 * h) - grads[name][index]) < 1e-7, name


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("fused", [False, True])
def test_adamw_steps_equal_torch(weight_decay, fused):
    """Three steps of torch.optim.AdamW on scratchlm's parameter groups (decay on matrices only)
    against adamw_step, parameter by parameter."""
    from scratchlm.training.optim import make_optimizer
    from scratchlm.training.train_config import TrainConfig

    model = perturbed_model(variant_config("learned", "layernorm", "gelu", "pre", False, "bias"), torch.float64)
    cfg = TrainConfig(lr=0.05, beta1=0.8, beta2=0.95, weight_decay=weight_decay)
    opt = make_optimizer(model, cfg, torch.device("cpu"))
    if not fused:
        for group in opt.param_groups:
            group["fused"] = False
    ours = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    moments = {n: (np.zeros_like(p), np.zeros_like(p)) for n, p in ours.items()}
    for step in range(1, 4):
        ids, targets = ids_and_targets(step)
        grads = _torch_grads(model, ids, targets)
        opt.step()
        for name, p in model.named_parameters():
            decay = weight_decay if p.dim() >= 2 else 0.0
            out = back.adamw_step(ours[name], grads[name], *moments[name], step,
                                  back.AdamWSettings(lr=0.05, beta1=0.8, beta2=0.95, eps=opt.param_groups[0]["eps"],
                                             weight_decay=decay))
            ours[name], moments[name] = out["param"], (out["m"], out["v"])
            np.testing.assert_allclose(out["param"], p.detach().numpy(), rtol=0, atol=1e-12, err_msg=name)
            np.testing.assert_allclose(out["m"], opt.state[p]["exp_avg"].numpy(), rtol=0, atol=1e-12)
