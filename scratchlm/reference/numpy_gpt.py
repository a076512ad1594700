"""The GPT forward pass in NumPy alone: the same math as `scratchlm/model/gpt.py`, to read and to check it.

Pure functions in the style of picoGPT, each signature annotated with its shapes. Symbols: T
sequence length, C width (`n_embd`), H heads, hs = C / H head size, V vocabulary, F the MLP's
hidden width. A leading `...` is any batch shape (nothing for one sequence, B for a batch).
This module imports neither torch nor anything from scratchlm, so it can never borrow the torch
model's code by accident.

Weights: a flat dict keyed by the torch model's state-dict names (`transformer.wte.weight`,
`transformer.h.0.attn.c_attn.weight`, ...), built by `params_from_state_dict`. Linear weights
keep torch's (out, in) layout. A bias whose key is missing is simply not there (the config's
bias switches are never consulted), and with tied weights a missing `lm_head.weight` means
`transformer.wte.weight`. Arithmetic happens in the dtype of the weights (float32 or float64).

`cfg` is a GPTConfig, any object with its attribute names, or a plain dict; missing variant
fields take GPTConfig's defaults.

`forward_trace(ids, params, cfg)` returns every intermediate, keyed as below. Shapes are for one
sequence `ids` of shape (T,); a batch (B, T) puts B in front of every shape except `pos`,
`rope_cos`, `rope_sin`, and `mask` without an attention_mask, which are the same for every row.
Block i's keys start with `h{i}.`:

    ids              (T,)        the input token ids
    wte              (T, C)      their rows of the token embedding table
    pos              (T, C)      what positions add: a row of wpe (learned) or of the sine table
                                 (sinusoidal); zeros for rope (it acts on q, k) and none
    rope_cos, rope_sin (T, hs/2) RoPE's rotation per position and pair (rope only)
    x0               (T, C)      wte + pos: the residual stream entering block 0
    h{i}.in          (T, C)      the residual stream entering block i
    h{i}.ln_1        (T, C)      pre-norm: ln_1(in), the attention's input
                                 post-norm: ln_1(resid_1), the MLP's input
    h{i}.q, .k, .v   (H, T, hs)  per-head queries, keys, values (q, k after RoPE under rope)
    h{i}.q_unrotated, h{i}.k_unrotated (H, T, hs)  q and k before RoPE (rope only)
    h{i}.scores      (H, T, T)   q k^T / sqrt(hs), before masking
    h{i}.mask        (T, T) bool True where query t may look at key s: causal, and with an
                                 attention_mask also not padding (then (B, T, T))
    h{i}.masked_scores (H, T, T) scores with -inf where the mask is False
    h{i}.weights     (H, T, T)   softmax over keys: the attention weights, rows sum to 1
    h{i}.heads       (H, T, hs)  weights @ v: each head's output
    h{i}.concat      (T, C)      heads side by side again
    h{i}.attn_out    (T, C)      concat through c_proj (W_O): what attention adds to the stream
    h{i}.resid_1     (T, C)      in + attn_out
    h{i}.ln_2        (T, C)      pre-norm: ln_2(resid_1), the MLP's input
                                 post-norm: ln_2(resid_2), the block's output
    h{i}.mlp_pre     (T, F)      c_fc's output, before the non-linearity
    h{i}.mlp_gate, h{i}.mlp_value (T, F/2)  swiglu only: the two halves of mlp_pre
    h{i}.mlp_hidden  (T, F')     after the non-linearity (F' = F, or F/2 for swiglu)
    h{i}.mlp_out     (T, C)      mlp_hidden through c_proj: what the MLP adds
    h{i}.resid_2     (T, C)      the MLP's input + mlp_out
    h{i}.out         (T, C)      the block's output (resid_2 for pre-norm, ln_2 for post-norm)
    ln_f             (T, C)      the final norm of the last block's output (absent when final_norm
                                 is off: there is no such norm)
    logits           (T, V)      ln_f (without a final norm: the last block's output) through
                                 lm_head: one score per vocabulary entry
    probs            (T, V)      softmax of logits: the next-token distribution at each position
    loss             ()          mean cross-entropy, only when targets are given
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "params_from_state_dict",
    "gpt_forward",
    "forward_trace",
    "cross_entropy",
    "sample_next",
    "next_token_probs",
    "embed",
    "sinusoidal_table",
    "rope_tables",
    "apply_rope",
    "layer_norm",
    "rms_norm",
    "linear",
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "softmax",
    "log_softmax",
    "split_heads",
    "merge_heads",
    "causal_mask",
    "attention_allowed",
    "attention",
]

# GPTConfig's defaults for the fields the forward pass reads (so a partial dict works too).
_DEFAULTS: dict[str, Any] = dict(
    n_inner=None,
    pos_embedding="learned",
    norm="layernorm",
    norm_eps=1e-5,
    activation="relu",
    norm_position="pre",
    final_norm=True,
    tie_weights=False,
    rope_theta=10000.0,
)


# ----------------------------------------------------------------------------- weights and config


def params_from_state_dict(state_dict: dict[str, Any], dtype: Any = None) -> dict[str, np.ndarray]:
    """A torch state dict (or a dict of arrays) as NumPy arrays under the same names.

    Tensors are recognised by their `.detach()` method, so torch is never imported here. `dtype`
    (e.g. np.float64) converts every floating-point array; None keeps the tensors' own dtype.
    """
    params = {}
    for name, value in state_dict.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        array = np.array(value)  # a copy: later changes to the torch model do not leak in
        if dtype is not None and np.issubdtype(array.dtype, np.floating):
            array = array.astype(dtype)
        params[name] = array
    return params


def _cfg(cfg: Any, name: str) -> Any:
    if isinstance(cfg, dict):
        return cfg[name] if name in cfg else _DEFAULTS[name]
    return getattr(cfg, name, _DEFAULTS.get(name))


def _tree(params: dict[str, np.ndarray]) -> dict[str, Any]:
    """Nest flat dotted names: tree["transformer"]["h"]["0"]["attn"]["c_attn"]["weight"]."""
    tree: dict[str, Any] = {}
    for name, value in params.items():
        node = tree
        *path, leaf = name.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


# ----------------------------------------------------------------------------- building blocks


def embed(ids: np.ndarray, table: np.ndarray) -> np.ndarray:  # [...] int, [V, C] -> [..., C]
    """Embedding lookup is row selection: token id i picks row i (ids are labels, not magnitudes)."""
    return table[ids]


def sinusoidal_table(n_pos: int, dim: int) -> np.ndarray:  # -> [n_pos, dim] float64
    """PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(pos / 10000^(2i/dim))."""
    pos = np.arange(n_pos, dtype=np.float64)[:, None]  # [n_pos, 1]
    two_i = np.arange(0, dim, 2, dtype=np.float64)  # [ceil(dim/2)]
    angle = pos / 10000.0 ** (two_i / dim)  # [n_pos, ceil(dim/2)]
    table = np.zeros((n_pos, dim))
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : dim // 2])  # an odd dim has no cosine for its last pair
    return table


def rope_tables(n_pos: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:  # -> [n_pos, hs/2] x2
    """cos and sin of RoPE's angles: pair i turns by pos * theta^(-2i / head_dim), float64."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # [hs/2]
    angle = np.arange(n_pos, dtype=np.float64)[:, None] * inv_freq[None, :]  # [n_pos, hs/2]
    return np.cos(angle), np.sin(angle)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:  # [..., T, hs], [T, hs/2] x2 -> [..., T, hs]
    """Rotate each pair (x[j], x[j + hs/2]) by its angle ("rotate half" layout, as in model/gpt.py)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # [..., T, hs/2] each
    return np.concatenate((x1 * cos - x2 * sin, x1 * sin + x2 * cos), axis=-1)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:  # [..., C] -> [..., C]
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis; var is the biased variance."""
    mean = x.mean(axis=-1, keepdims=True)  # [..., 1]
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # [..., 1]
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:  # [..., C] -> [..., C]
    """x / sqrt(mean(x^2) + eps) * gamma: no centring and no beta (torch's nn.RMSNorm)."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def _norm(x: np.ndarray, w: dict[str, np.ndarray], cfg: Any) -> np.ndarray:  # [..., C] -> [..., C]
    eps = _cfg(cfg, "norm_eps")
    if _cfg(cfg, "norm") == "rmsnorm":
        return rms_norm(x, w["weight"], eps)
    return layer_norm(x, w["weight"], w["bias"], eps)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:  # [..., in], [out, in], [out] -> [..., out]
    """x W^T + b with torch's (out, in) weight layout."""
    y = x @ weight.T
    return y if bias is None else y + bias


def relu(x: np.ndarray) -> np.ndarray:  # [...] -> [...]
    return np.maximum(x, 0).astype(x.dtype)


# math.erf is exact to float64 rounding; NumPy has no erf of its own.
_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray) -> np.ndarray:  # [...] -> [...]
    """Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), evaluated in float64."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))).astype(x.dtype)


def gelu_tanh(x: np.ndarray) -> np.ndarray:  # [...] -> [...]
    """GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x: np.ndarray) -> np.ndarray:  # [...] -> [...]
    """x * sigmoid(x), written as x / (1 + e^-x)."""
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:  # [..., n] -> [..., n]
    """exp(x) / sum exp(x); subtracting the max first changes nothing but avoids overflow."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))  # -inf entries become exactly 0
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:  # [..., n] -> [..., n]
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def split_heads(x: np.ndarray, n_head: int) -> np.ndarray:  # [..., T, C] -> [..., H, T, hs]
    *lead, T, C = x.shape
    x = x.reshape(*lead, T, n_head, C // n_head)  # [..., T, H, hs]: head h owns columns h*hs:(h+1)*hs
    return np.swapaxes(x, -2, -3)  # [..., H, T, hs]


def merge_heads(x: np.ndarray) -> np.ndarray:  # [..., H, T, hs] -> [..., T, C]
    *lead, H, T, hs = x.shape
    x = np.swapaxes(x, -2, -3)  # [..., T, H, hs]
    return x.reshape(*lead, T, H * hs)  # heads side by side: [..., T, C]


def causal_mask(T: int) -> np.ndarray:  # -> [T, T] bool
    """True on and below the diagonal: query t may look at keys 0..t, never at the future."""
    return np.tril(np.ones((T, T), dtype=bool))


def attention_allowed(T: int, attention_mask: np.ndarray | None = None) -> np.ndarray:  # [...?, T] -> [..., T, T] bool
    """The causal mask, further restricted to real (non-padding) keys when attention_mask is given.

    attention_mask: 1 for real tokens, 0 for padding, (T,) or (B, T). As in model/gpt.py, a padding
    query still sees itself, so no softmax row is empty.
    """
    allowed = causal_mask(T)  # [T, T]
    if attention_mask is None:
        return allowed
    real_keys = np.asarray(attention_mask).astype(bool)[..., None, :]  # [..., 1, T]
    return (allowed & real_keys) | np.eye(T, dtype=bool)  # [..., T, T]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    # [..., T, hs] x3, [..., T, T] bool -> [..., T, hs], intermediates
    """Scaled dot-product attention: softmax(q k^T / sqrt(hs), masked) @ v."""
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # [..., T, T]
    masked = np.where(allowed, scores, -np.inf)  # a masked score gets zero weight after softmax
    weights = softmax(masked, axis=-1)  # [..., T, T], each row sums to 1 over the keys
    out = weights @ v  # [..., T, hs]
    return out, dict(scores=scores, masked_scores=masked, weights=weights)


def _put(trace: dict | None, key: str, value: Any) -> None:
    if trace is not None:
        trace[key] = value


# ----------------------------------------------------------------------------- the model


def mha(x: np.ndarray, c_attn: dict, c_proj: dict, n_head: int, allowed: np.ndarray,
        rope: tuple[np.ndarray, np.ndarray] | None, trace: dict | None = None, prefix: str = "") -> np.ndarray:
    # [..., T, C] -> [..., T, C]
    """Causal multi-head self-attention: project to Q, K, V, attend per head, merge, project by W_O.
    Grouped-query attention (c_attn has fewer than 3C rows): K and V have fewer heads, each
    repeated for the query heads of its group; the trace's k and v are the repeated ones."""
    C = x.shape[-1]
    qkv = linear(x, **c_attn)  # [..., T, C + 2 C_kv]: rows of c_attn.weight are [W_Q; W_K; W_V]
    kv_width = (c_attn["weight"].shape[0] - C) // 2  # C_kv: C without grouped-query attention
    n_kv = kv_width // (C // n_head)  # key/value heads
    q, k, v = np.split(qkv, [C, C + kv_width], axis=-1)  # [..., T, C], [..., T, C_kv] twice
    q, k, v = split_heads(q, n_head), split_heads(k, n_kv), split_heads(v, n_kv)  # [..., H or H_kv, T, hs]
    if rope is not None:
        _put(trace, prefix + "q_unrotated", q)
        _put(trace, prefix + "k_unrotated", np.repeat(k, n_head // n_kv, axis=-3))
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    # query head h reads key/value head h // (H / H_kv): each repeated for its group, [..., H, T, hs]
    k, v = np.repeat(k, n_head // n_kv, axis=-3), np.repeat(v, n_head // n_kv, axis=-3)
    # allowed is [..., T, T]; heads sit between the batch and T axes
    heads, parts = attention(q, k, v, allowed[..., None, :, :])  # [..., H, T, hs]
    concat = merge_heads(heads)  # [..., T, C]
    out = linear(concat, **c_proj)  # [..., T, C]
    for key, value in dict(q=q, k=k, v=v, scores=parts["scores"], mask=allowed,
                           masked_scores=parts["masked_scores"], weights=parts["weights"],
                           heads=heads, concat=concat, attn_out=out).items():
        _put(trace, prefix + key, value)
    return out


def ffn(x: np.ndarray, c_fc: dict, c_proj: dict, activation: str,
        trace: dict | None = None, prefix: str = "") -> np.ndarray:  # [..., T, C] -> [..., T, C]
    """Position-wise MLP: C -> F -> non-linearity -> C. swiglu: silu(gate) * value, F/2 wide."""
    pre = linear(x, **c_fc)  # [..., T, F]
    _put(trace, prefix + "mlp_pre", pre)
    if activation == "relu":
        hidden = relu(pre)
    elif activation == "gelu":
        hidden = gelu(pre)
    elif activation == "gelu_tanh":
        hidden = gelu_tanh(pre)
    elif activation == "swiglu":
        gate, value = np.split(pre, 2, axis=-1)  # [..., T, F/2] each: c_fc's output is [gate | value]
        _put(trace, prefix + "mlp_gate", gate)
        _put(trace, prefix + "mlp_value", value)
        hidden = silu(gate) * value
    else:
        raise ValueError(f"unknown activation {activation!r}")
    out = linear(hidden, **c_proj)  # [..., T, C]
    _put(trace, prefix + "mlp_hidden", hidden)
    _put(trace, prefix + "mlp_out", out)
    return out


def transformer_block(x: np.ndarray, block: dict, cfg: Any, allowed: np.ndarray,
                      rope: tuple[np.ndarray, np.ndarray] | None,
                      trace: dict | None = None, prefix: str = "") -> np.ndarray:  # [..., T, C] -> [..., T, C]
    """Pre-norm: x + attn(ln_1(x)), then + mlp(ln_2(.)). Post-norm: ln_1(x + attn(x)), ln_2(. + mlp(.))."""
    n_head, activation, position = _cfg(cfg, "n_head"), _cfg(cfg, "activation"), _cfg(cfg, "norm_position")
    if position not in ("pre", "post"):
        raise ValueError(f"unknown norm_position {position!r}")
    _put(trace, prefix + "in", x)
    sublayers = (("1", lambda h: mha(h, **block["attn"], n_head=n_head, allowed=allowed, rope=rope, trace=trace,
                                     prefix=prefix)),
                 ("2", lambda h: ffn(h, **block["mlp"], activation=activation, trace=trace, prefix=prefix)))
    for i, sublayer in sublayers:  # attention, then the MLP, each in a residual branch
        norm = block["ln_" + i]
        if position == "pre":  # the branch sees the normalised stream; the sum is left as it is
            h = _norm(x, norm, cfg)
            _put(trace, prefix + "ln_" + i, h)
            x = x + sublayer(h)
            _put(trace, prefix + "resid_" + i, x)
        else:  # post-norm: the branch sees the stream itself, and the sum is normalised
            x = x + sublayer(x)
            _put(trace, prefix + "resid_" + i, x)
            x = _norm(x, norm, cfg)
            _put(trace, prefix + "ln_" + i, x)
    _put(trace, prefix + "out", x)
    return x


def _forward(ids: np.ndarray, params: dict[str, np.ndarray], cfg: Any,
             attention_mask: np.ndarray | None, trace: dict | None) -> np.ndarray:  # [..., T] -> [..., T, V]
    ids = np.asarray(ids)
    T = ids.shape[-1]
    if T > _cfg(cfg, "block_size"):
        raise ValueError(f"sequence length {T} exceeds block_size={_cfg(cfg, 'block_size')}")
    tree = _tree(params)
    model = tree["transformer"]
    dtype = model["wte"]["weight"].dtype
    C, n_head = _cfg(cfg, "n_embd"), _cfg(cfg, "n_head")
    kind = _cfg(cfg, "pos_embedding")

    tok = embed(ids, model["wte"]["weight"])  # [..., T, C]
    rope = None
    if kind == "learned":
        pos = model["wpe"]["weight"][:T]  # [T, C], broadcast over the batch
    elif kind == "sinusoidal":
        pos = sinusoidal_table(T, C).astype(dtype)  # [T, C]
    elif kind in ("rope", "none"):
        pos = np.zeros((T, C), dtype=dtype)  # nothing is added to the embeddings
        if kind == "rope":
            cos, sin = rope_tables(T, C // n_head, _cfg(cfg, "rope_theta"))  # [T, hs/2] each
            rope = (cos.astype(dtype), sin.astype(dtype))
            _put(trace, "rope_cos", rope[0])
            _put(trace, "rope_sin", rope[1])
    else:
        raise ValueError(f"unknown pos_embedding {kind!r}")
    x = tok + pos  # [..., T, C]
    _put(trace, "ids", ids)
    _put(trace, "wte", tok)
    _put(trace, "pos", pos)
    _put(trace, "x0", x)

    allowed = attention_allowed(T, attention_mask)  # [..., T, T]
    for i in range(_cfg(cfg, "n_layer")):
        x = transformer_block(x, model["h"][str(i)], cfg, allowed, rope, trace, prefix=f"h{i}.")
    if _cfg(cfg, "final_norm"):  # else lm_head reads the last block's output as it is
        x = _norm(x, model["ln_f"], cfg)  # [..., T, C]
        _put(trace, "ln_f", x)

    head = dict(tree.get("lm_head", {}))
    if "weight" not in head:
        if not _cfg(cfg, "tie_weights"):
            raise KeyError("lm_head.weight is missing and tie_weights is off")
        head["weight"] = model["wte"]["weight"]  # tied: the embedding matrix scores the tokens
    return linear(x, **head)  # [..., T, V]


def gpt_forward(ids: np.ndarray, params: dict[str, np.ndarray], cfg: Any,
                attention_mask: np.ndarray | None = None) -> np.ndarray:  # [..., T] -> [..., T, V]
    """Token ids to logits. attention_mask (same shape as ids): 1 real, 0 padding on the right."""
    return _forward(ids, params, cfg, attention_mask, trace=None)


def forward_trace(ids: np.ndarray, params: dict[str, np.ndarray], cfg: Any,
                  attention_mask: np.ndarray | None = None, targets: np.ndarray | None = None,
                  ignore_index: int = -100) -> dict[str, np.ndarray]:  # [..., T] -> {name: array}
    """Run the forward pass and keep every intermediate; the keys are listed in the module docstring."""
    trace: dict[str, np.ndarray] = {}
    logits = _forward(ids, params, cfg, attention_mask, trace)
    trace["logits"] = logits
    trace["probs"] = softmax(logits, axis=-1)
    if targets is not None:
        trace["loss"] = cross_entropy(logits, targets, ignore_index)
    return trace


def cross_entropy(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100) -> np.ndarray:
    # [..., V], [...] int -> [] mean over the targets that are not ignore_index
    """Mean of -log softmax(logits)[target]; targets equal to ignore_index count for nothing.

    Like torch, the result is NaN when every target is ignored (an average over nothing).
    """
    logp = log_softmax(logits, axis=-1).reshape(-1, logits.shape[-1])  # [N, V]
    targets = np.asarray(targets).reshape(-1)  # [N]
    keep = targets != ignore_index
    picked = logp[np.flatnonzero(keep), targets[keep]]  # [n_kept]
    with np.errstate(invalid="ignore", divide="ignore"):
        return -picked.sum() / keep.sum()


# ----------------------------------------------------------------------------- sampling


def next_token_probs(logits_row: np.ndarray, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> np.ndarray:  # [V] -> [V] float64
    """The distribution `sample_next` draws from, in float64.

    Order: divide the logits by the temperature, keep the top_k highest (ties with the k-th are
    all kept), then keep the smallest set of most likely tokens whose probability adds up to at
    least top_p (never fewer than one), and renormalise. temperature 0 puts all mass on argmax.
    """
    logits = np.asarray(logits_row, dtype=np.float64)
    if logits.ndim != 1:
        raise ValueError(f"logits_row must be one row of V scores, got shape {logits.shape}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")
    if temperature == 0:
        probs = np.zeros_like(logits)
        probs[np.argmax(logits)] = 1.0
        return probs
    logits = logits / temperature  # < 1 sharpens the distribution, > 1 flattens it
    if top_k is not None and top_k < logits.size:
        kth = np.sort(logits)[-top_k]  # the k-th highest score
        logits = np.where(logits >= kth, logits, -np.inf)
    probs = softmax(logits)
    if top_p is not None:
        order = np.argsort(-probs, kind="stable")  # most likely first
        ranked = probs[order]
        mass_before = np.concatenate(([0.0], np.cumsum(ranked)[:-1]))  # mass of the tokens ranked above each
        keep = np.zeros(probs.size, dtype=bool)
        keep[order[mass_before < top_p]] = True  # the first token always has 0 before it
        probs = np.where(keep, probs, 0.0)
        probs = probs / probs.sum()
    return probs


def sample_next(logits_row: np.ndarray, rng: np.random.Generator, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None) -> int:  # [V] -> token id
    """Draw the next token id from `next_token_probs(...)` with the NumPy Generator `rng`."""
    probs = next_token_probs(logits_row, temperature, top_k, top_p)
    return int(rng.choice(probs.size, p=probs))
