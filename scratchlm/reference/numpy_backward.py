"""The backward pass and one AdamW step in NumPy alone, written out by hand: the gradient of the
mean cross-entropy with respect to every parameter of the model in numpy_gpt, and the update
torch.optim.AdamW makes with it. Like numpy_gpt, nothing here imports torch or scratchlm.

Every function takes what the forward pass kept (`forward_trace`'s dictionary) and the gradient
of its output, and returns the gradient of its input (and of its weights). The chain, last
station first:

    loss = mean_t -log softmax(logits_t)[y_t]  ->  dlogits = (probs - onehot(y)) / n
    logits = ln_f W^T + b                      ->  dln_f = dlogits W, dW = dlogits^T ln_f, db = sum dlogits
    ln_f = norm(out of the last block)         ->  the norm's backward (without a final norm, final_norm
                                                   off, lm_head reads the last block's output directly)
    each block, last first                     ->  residual branches add their gradients
    x0 = wte[ids] + pos                        ->  dwte[id] += dx0 row, dwpe[t] += dx0 row

Shapes as in numpy_gpt: T sequence length, C width, H heads, hs head size, F the MLP's width,
and any leading batch shape `...`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    from .numpy_gpt import _cfg, _tree, merge_heads, softmax, split_heads
except ImportError:  # loaded by file path beside numpy_gpt.py, without the scratchlm package (and torch)
    from numpy_gpt import _cfg, _tree, merge_heads, softmax, split_heads  # type: ignore[no-redef]

__all__ = [
    "gpt_backward",
    "cross_entropy_backward",
    "linear_backward",
    "layer_norm_backward",
    "rms_norm_backward",
    "activation_backward",
    "softmax_backward",
    "rope_backward",
    "AdamWSettings",
    "adamw_step",
]


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100) -> np.ndarray:
    # [..., V], [...] -> [..., V]
    """d(mean cross-entropy)/d logits: (softmax - one-hot of the target) / (targets counted); an
    ignored target's row gets zeros."""
    targets = np.asarray(targets)
    keep = targets != ignore_index
    grad = softmax(logits, axis=-1)
    rows = grad.reshape(-1, grad.shape[-1])  # a view: writing it writes grad
    flat_targets, flat_keep = targets.reshape(-1), keep.reshape(-1)
    rows[np.flatnonzero(flat_keep), flat_targets[flat_keep]] -= 1.0
    rows[~flat_keep] = 0.0
    return grad / keep.sum()


def linear_backward(x: np.ndarray, weight: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # [..., in], [out, in], [..., out] -> dx [..., in], dW [out, in], db [out]
    """y = x W^T + b: dx = dy W, dW = dy^T x and db = dy, each summed over every row."""
    rows_x, rows_dy = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dy @ weight, rows_dy.T @ rows_x, rows_dy.sum(axis=0)


def layer_norm_backward(x: np.ndarray, weight: np.ndarray, eps: float, dy: np.ndarray):
    # [..., C] x2 -> dx [..., C], dgamma [C], dbeta [C]
    """y = x_hat gamma + beta with x_hat = (x - mean) / sigma. The mean and sigma depend on every
    entry of the row, so dx = (g - mean(g) - x_hat mean(g x_hat)) / sigma with g = dy gamma."""
    mean = x.mean(axis=-1, keepdims=True)
    sigma = np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    x_hat = (x - mean) / sigma
    g = dy * weight
    dx = (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)) / sigma
    C = x.shape[-1]
    return dx, (dy * x_hat).reshape(-1, C).sum(axis=0), dy.reshape(-1, C).sum(axis=0)


def rms_norm_backward(x: np.ndarray, weight: np.ndarray, eps: float, dy: np.ndarray):
    # [..., C] x2 -> dx [..., C], dgamma [C]
    """y = x r gamma with r = 1 / sqrt(mean(x^2) + eps): dx = r g - x r^3 mean(g x), g = dy gamma."""
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    g = dy * weight
    dx = r * g - x * r**3 * (g * x).mean(axis=-1, keepdims=True)
    return dx, (dy * x * r).reshape(-1, x.shape[-1]).sum(axis=0)


def _norm_backward(x: np.ndarray, w: dict, cfg: Any, dy: np.ndarray, grads: dict, name: str) -> np.ndarray:
    eps = _cfg(cfg, "norm_eps")
    if _cfg(cfg, "norm") == "rmsnorm":
        dx, grads[name + ".weight"] = rms_norm_backward(x, w["weight"], eps, dy)
    else:
        dx, grads[name + ".weight"], grads[name + ".bias"] = layer_norm_backward(x, w["weight"], eps, dy)
    return dx


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def activation_backward(pre: np.ndarray, activation: str, dy: np.ndarray) -> np.ndarray:
    # [..., F], [..., F'] -> [..., F]
    """The derivative of each non-linearity, times the gradient of its output:
    relu 1 where x > 0; gelu Phi(x) + x phi(x); gelu_tanh by the chain rule through tanh;
    swiglu (silu(a) b): d a = dy b silu'(a) with silu'(a) = s (1 + a (1 - s)), d b = dy silu(a)."""
    if activation == "relu":
        return dy * (pre > 0)
    if activation == "gelu":
        cdf = 0.5 * (1.0 + _erf(pre / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * pre * pre) / math.sqrt(2.0 * math.pi)
        return dy * (cdf + pre * pdf)
    if activation == "gelu_tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (pre + 0.044715 * pre**3))
        inner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * pre * pre)
        return dy * (0.5 * (1.0 + t) + 0.5 * pre * (1.0 - t * t) * inner)
    if activation == "swiglu":
        gate, value = np.split(pre, 2, axis=-1)
        s = 1.0 / (1.0 + np.exp(-gate))
        return np.concatenate((dy * value * s * (1.0 + gate * (1.0 - s)), dy * gate * s), axis=-1)
    raise ValueError(f"unknown activation {activation!r}")


def softmax_backward(probs: np.ndarray, dy: np.ndarray) -> np.ndarray:  # [..., n] x2 -> [..., n]
    """p = softmax(s): ds = p (dy - sum(dy p)). A masked score has p = 0, so it gets no gradient."""
    return probs * (dy - (dy * probs).sum(axis=-1, keepdims=True))


def rope_backward(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    # [..., T, hs], [T, hs/2] x2 -> [..., T, hs]
    """RoPE is a rotation of each pair; its gradient is the rotation back (by minus the angle)."""
    half = dy.shape[-1] // 2
    d1, d2 = dy[..., :half], dy[..., half:]
    return np.concatenate((d1 * cos + d2 * sin, -d1 * sin + d2 * cos), axis=-1)


def _linear_grads(x, layer: dict, dy, grads: dict, name: str) -> np.ndarray:
    dx, grads[name + ".weight"], db = linear_backward(x, layer["weight"], dy)
    if "bias" in layer:
        grads[name + ".bias"] = db
    return dx


@dataclass(frozen=True)
class _Layer:
    """What every branch of block i's backward pass reads: its weights, the config, the forward
    trace (its keys prefixed `p`), where gradients go (under `name`), and RoPE's tables or None."""

    block: dict
    cfg: Any
    trace: dict
    p: str
    name: str
    grads: dict
    rope: Any


def _attention_backward(x, layer: _Layer, d_out) -> np.ndarray:
    """Back through c_proj, the weighted sum, the softmax, the scaled scores, RoPE and c_attn."""
    block, cfg, trace, p, grads, name, rope = (layer.block, layer.cfg, layer.trace, layer.p, layer.grads,
                                               layer.name, layer.rope)
    attn = block["attn"]
    d_concat = _linear_grads(trace[p + "concat"], attn["c_proj"], d_out, grads, name + ".attn.c_proj")
    d_heads = split_heads(d_concat, _cfg(cfg, "n_head"))  # [..., H, T, hs]
    q, k, v, weights = trace[p + "q"], trace[p + "k"], trace[p + "v"], trace[p + "weights"]
    d_weights = d_heads @ np.swapaxes(v, -1, -2)  # heads = weights @ v
    dv = np.swapaxes(weights, -1, -2) @ d_heads
    d_scores = softmax_backward(weights, d_weights) / math.sqrt(q.shape[-1])  # scores = q k^T / sqrt(hs)
    dq, dk = d_scores @ k, np.swapaxes(d_scores, -1, -2) @ q
    n_head, (rows, C) = _cfg(cfg, "n_head"), attn["c_attn"]["weight"].shape
    n_kv = (rows - C) // 2 // (C // n_head)  # key/value heads: n_head, or fewer under grouped-query attention
    if n_kv != n_head:  # a key/value head served its group of query heads: it collects all their shares
        dk, dv = (t.reshape(*t.shape[:-3], n_kv, n_head // n_kv, *t.shape[-2:]).sum(axis=-3) for t in (dk, dv))
    if rope is not None:
        dq, dk = rope_backward(dq, *rope), rope_backward(dk, *rope)
    d_qkv = np.concatenate([merge_heads(t) for t in (dq, dk, dv)], axis=-1)  # c_attn's output is [q | k | v]
    return _linear_grads(x, attn["c_attn"], d_qkv, grads, name + ".attn.c_attn")


def _mlp_backward(x, layer: _Layer, d_out) -> np.ndarray:
    mlp, trace, p, grads, name = layer.block["mlp"], layer.trace, layer.p, layer.grads, layer.name
    d_hidden = _linear_grads(trace[p + "mlp_hidden"], mlp["c_proj"], d_out, grads, name + ".mlp.c_proj")
    d_pre = activation_backward(trace[p + "mlp_pre"], _cfg(layer.cfg, "activation"), d_hidden)
    return _linear_grads(x, mlp["c_fc"], d_pre, grads, name + ".mlp.c_fc")


def _block_backward(block: dict, cfg: Any, trace: dict, i: int, d_out, grads: dict, rope) -> np.ndarray:
    """Block i's gradients, given the gradient of its output; returns that of its input.
    Pre-norm: out = r1 + mlp(ln_2(r1)), r1 = in + attn(ln_1(in)): the residual passes d_out
    through untouched and each branch adds its share. Post-norm: out = ln_2(ln_1(r1) + mlp(ln_1(r1))),
    r1 = in + attn(in): each norm comes first on the way back."""
    p, name = f"h{i}.", f"transformer.h.{i}"
    layer = _Layer(block, cfg, trace, p, name, grads, rope)
    if _cfg(cfg, "norm_position") == "pre":
        d_ln2 = _mlp_backward(trace[p + "ln_2"], layer, d_out)
        d_resid1 = d_out + _norm_backward(trace[p + "resid_1"], block["ln_2"], cfg, d_ln2, grads, name + ".ln_2")
        d_ln1 = _attention_backward(trace[p + "ln_1"], layer, d_resid1)
        return d_resid1 + _norm_backward(trace[p + "in"], block["ln_1"], cfg, d_ln1, grads, name + ".ln_1")
    d_resid2 = _norm_backward(trace[p + "resid_2"], block["ln_2"], cfg, d_out, grads, name + ".ln_2")
    d_ln1 = d_resid2 + _mlp_backward(trace[p + "ln_1"], layer, d_resid2)
    d_resid1 = _norm_backward(trace[p + "resid_1"], block["ln_1"], cfg, d_ln1, grads, name + ".ln_1")
    return d_resid1 + _attention_backward(trace[p + "in"], layer, d_resid1)


def gpt_backward(trace: dict[str, np.ndarray], params: dict[str, np.ndarray], cfg: Any, targets: np.ndarray,
                 ignore_index: int = -100) -> dict[str, np.ndarray]:
    """The gradient of the mean cross-entropy of `trace` (forward_trace's output for the same
    params) with respect to every parameter, keyed like `params`. Tied weights: one gradient,
    under `transformer.wte.weight`, the sum of the embedding's and the head's shares. The trace
    also gains `dlogits`, the loss's gradient at the logits. No dropout (the forward has none)."""
    tree = _tree(params)
    model = tree["transformer"]
    grads: dict[str, np.ndarray] = {}
    trace["dlogits"] = d_logits = cross_entropy_backward(trace["logits"], targets, ignore_index)
    head = tree.get("lm_head", {})
    tied = "weight" not in head
    head_weight = model["wte"]["weight"] if tied else head["weight"]
    n_layer, final_norm = _cfg(cfg, "n_layer"), _cfg(cfg, "final_norm")
    last = trace[f"h{n_layer - 1}.out"] if n_layer else trace["x0"]
    d_head_in, d_head, d_head_bias = linear_backward(trace["ln_f"] if final_norm else last, head_weight, d_logits)
    if "bias" in head:
        grads["lm_head.bias"] = d_head_bias
    d = _norm_backward(last, model["ln_f"], cfg, d_head_in, grads, "transformer.ln_f") if final_norm else d_head_in
    rope = (trace["rope_cos"], trace["rope_sin"]) if "rope_cos" in trace else None
    for i in reversed(range(n_layer)):
        d = _block_backward(model["h"][str(i)], cfg, trace, i, d, grads, rope)
    ids = np.asarray(trace["ids"])
    d_wte = np.zeros_like(model["wte"]["weight"])
    np.add.at(d_wte, ids.reshape(-1), d.reshape(-1, d.shape[-1]))  # a repeated id collects every row's share
    grads["transformer.wte.weight"] = d_wte + d_head if tied else d_wte
    if not tied:
        grads["lm_head.weight"] = d_head
    if "wpe" in model:
        d_wpe = np.zeros_like(model["wpe"]["weight"])
        d_wpe[: ids.shape[-1]] = d.reshape(-1, *d.shape[-2:]).sum(axis=0)  # each position's row, over the batch
        grads["transformer.wpe.weight"] = d_wpe
    return grads


@dataclass(frozen=True)
class AdamWSettings:
    """AdamW's settings (torch.optim.AdamW's names and defaults, weight decay off)."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0


def adamw_step(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, step: int,
               hp: AdamWSettings) -> dict[str, np.ndarray]:
    """One AdamW update of one parameter, step = 1, 2, ... (torch.optim.AdamW's order), with
    `hp`'s lr, beta1, beta2, eps and weight_decay:

        param <- param (1 - lr weight_decay)              decay, apart from the gradient
        m <- beta1 m + (1 - beta1) grad                   mean of the gradients
        v <- beta2 v + (1 - beta2) grad^2                 mean of their squares
        m_hat = m / (1 - beta1^step), v_hat = v / (1 - beta2^step)   bias correction: m, v start at 0
        param <- param - lr m_hat / (sqrt(v_hat) + eps)

    Returns every quantity under those names, plus `update` (new param - old param)."""
    lr, beta1, beta2, eps, weight_decay = hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay
    decayed = param * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * grad
    v = beta2 * v + (1.0 - beta2) * grad * grad
    m_hat, v_hat = m / (1.0 - beta1**step), v / (1.0 - beta2**step)
    new = decayed - lr * m_hat / (np.sqrt(v_hat) + eps)
    return dict(param=new, m=m, v=v, m_hat=m_hat, v_hat=v_hat, update=new - param)
