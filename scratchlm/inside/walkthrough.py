"""The hand-sized walkthrough: every matrix of one tiny forward pass, computed by the model's own
modules (`torch_trace`, read off the real code) beside the NumPy twin (scratchlm.reference), for
a learner to follow station by station. `scratchlm walkthrough` prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.hooks import RemovableHandle

from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT, apply_rope

WALKTHROUGH_IDS = (1, 3, 2)
"""The fixed example input: three token ids out of the hand preset's five."""

# (trace key, what it is) in the order of the forward pass; `h{i}.` keys repeat per block
_GLOBAL_STEPS = [
    ("wte", "token embeddings wte[ids]  (T, C)"),
    ("pos", "position embeddings wpe[0..T-1]  (T, C)"),
    ("x0", "x0 = token + position  (T, C): the block's input"),
]
_BLOCK_STEPS = [
    ("ln_1", "ln_1(x): LayerNorm of each row  (T, C)"),
    ("q", "Q = ln_1(x) W_Q^T, split into heads  (H, T, hs)"),
    ("k", "K = ln_1(x) W_K^T, split into heads  (H, T, hs)"),
    ("v", "V = ln_1(x) W_V^T, split into heads  (H, T, hs)"),
    ("scores", "scores = Q K^T / sqrt(hs) per head  (H, T, T)"),
    ("mask", "causal mask: 1 where query t may see key s <= t  (T, T)"),
    ("masked_scores", "scores with the future set to -inf  (H, T, T)"),
    ("weights", "softmax of the masked scores over each row  (H, T, T)"),
    ("heads", "head outputs = weights @ V  (H, T, hs)"),
    ("concat", "heads side by side  (T, C)"),
    ("attn_out", "attention output = concat W_O^T + b_O  (T, C)"),
    ("resid_1", "residual: x + attention output  (T, C)"),
    ("ln_2", "ln_2 of the residual  (T, C)"),
    ("mlp_pre", "MLP first layer c_fc  (T, 4C)"),
    ("mlp_hidden", "after the activation  (T, 4C)"),
    ("mlp_out", "MLP output c_proj  (T, C)"),
    ("out", "block output: residual + MLP output  (T, C)"),
]
# post-norm computes the same keys from other inputs: the titles that differ
_POST_NORM_TITLES = {
    "ln_1": "ln_1(x + attention output): post-norm normalises the residual sum  (T, C)",
    "q": "Q = x W_Q^T (post-norm: the block's input itself), split into heads  (H, T, hs)",
    "k": "K = x W_K^T (post-norm: the block's input itself), split into heads  (H, T, hs)",
    "v": "V = x W_V^T (post-norm: the block's input itself), split into heads  (H, T, hs)",
    "resid_1": "residual: x + attention output, before ln_1  (T, C)",
    "ln_2": "ln_2(ln_1 + MLP output): post-norm normalises the second residual sum  (T, C)",
    "mlp_pre": "MLP first layer c_fc of ln_1  (T, 4C)",
    "out": "block output: ln_2 above, passed on as it is  (T, C)",
}
_POST_NORM_ORDER = ("q", "k", "v", "scores", "mask", "masked_scores", "weights", "heads", "concat", "attn_out",
                    "resid_1", "ln_1", "mlp_pre", "mlp_hidden", "mlp_out", "ln_2", "out")
"""Post-norm's stations in the order it computes them: each norm after its residual sum."""
_FINAL_STEPS = [
    ("ln_f", "final norm ln_f  (T, C)"),
    ("logits", "logits = ln_f W_lm^T + b_lm  (T, V)"),
    ("probs", "probabilities = softmax(logits) per row  (T, V)"),
]
# final_norm off: no ln_f station (there is nothing to print), and the logits say what they read
_NO_FINAL_NORM_STEPS = [
    ("logits", "logits = last block output W_lm^T + b_lm: no final norm in between  (T, V)"),
    _FINAL_STEPS[-1],
]


WALKTHROUGH_MAX_LINES = 3000
"""The most lines `scratchlm walkthrough` prints: the walk is for hand-sized models; a bigger one
is a wall of numbers nobody reads (smoke: about 50,000 lines of 1,000+ columns)."""

WALKTHROUGH_MAX_ROW = 64
"""The most numbers on one printed row."""


def printed_size(cfg: GPTConfig, tokens: int) -> tuple[int, int]:
    """(lines, numbers on the widest row) that format_walkthrough prints for `cfg` and `tokens`
    ids, from the shapes alone (no model is built): a line per row of every weight matrix, then
    per step a line per row (per head for the (H, T, .) steps)."""
    with torch.device("meta"):
        params = list(GPT(cfg).named_parameters())
    lines = 8 + sum(p.shape[0] if p.dim() == 2 else 1 for _, p in params) + len(params)  # 8: headings
    widest = max(p.shape[-1] for _, p in params)
    per_head = {"q", "k", "v", "scores", "masked_scores", "weights", "heads"}
    block = sum(cfg.n_head * (tokens + 1) if key in per_head else tokens for key, _ in _BLOCK_STEPS)
    final = _FINAL_STEPS if cfg.final_norm else _NO_FINAL_NORM_STEPS
    lines += cfg.n_layer * (block + 2 * len(_BLOCK_STEPS) + 2) + (len(_GLOBAL_STEPS) + len(final)) * (tokens + 2)
    widest = max(widest, cfg.vocab_size, cfg.mlp_hidden, tokens)
    return lines, widest


def walkthrough_model(preset: str | GPTConfig = "hand", seed: int = 0, init: str = "hand",
                      dtype: torch.dtype = torch.float64) -> GPT:
    """The preset's model (or a config's) with weights a learner can multiply by hand.

    init "hand": every entry of every weight matrix and embedding table drawn uniformly from
    -1.0, -0.9, ..., 1.0 (one decimal), biases 0, norm gamma 1 and beta 0. The model's own init
    would give embeddings of about 0.02, which print as 0.0000. init "model": the model's own
    initialisation, unrounded.
    """
    if init not in ("hand", "model"):
        raise ValueError(f"init must be 'hand' or 'model', got {init!r}")
    torch.manual_seed(seed)
    cfg = preset if isinstance(preset, GPTConfig) else GPTConfig.from_name(preset)
    model = GPT(cfg).to(dtype).eval()
    if init == "hand":
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim >= 2:
                    p.copy_(torch.randint(-10, 11, p.shape, generator=gen).to(dtype) / 10)
    return model


@torch.no_grad()
def torch_trace(model: GPT, ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Every intermediate of one forward pass of the torch model on one sequence, under the keys
    of the NumPy reference's forward_trace.

    Captured from the real modules with hooks and from the explicit attention path's weights;
    where no module boundary exists (Q, K, V per head, the raw scores) they are rebuilt from a
    captured tensor: c_attn's output split as CausalSelfAttention.forward splits it.
    """
    idx = torch.tensor([list(ids)], dtype=torch.long, device=next(model.parameters()).device)  # (1, T)
    out: dict[str, torch.Tensor] = {}
    hooks = _trace_hooks(model, out)
    weights: list[torch.Tensor] = []
    try:
        logits, _ = model(idx, attn_weights=weights)  # a list here switches on the explicit path
    finally:
        for h in hooks:
            h.remove()
    if "pos" not in out:  # sinusoidal, rope or none: whatever was added to the token embeddings
        out["pos"] = out["x0"] - out["wte"]
    _attention_inside(model, out, weights, idx.shape[1])
    out["logits"] = logits[0]
    out["probs"] = F.softmax(logits[0], dim=-1)
    return {key: value.detach().cpu().numpy() for key, value in out.items()}


def _trace_hooks(model: GPT, out: dict[str, torch.Tensor]) -> list[RemovableHandle]:
    """Forward hooks that store each module's output (or input) of sequence 0 in `out`."""

    def save_output(key):
        return lambda module, args, output: out.__setitem__(key, output[0])

    def save_input(key):
        return lambda module, args: out.__setitem__(key, args[0][0])

    tr, hooks = model.transformer, []
    hooks.append(tr.wte.register_forward_hook(save_output("wte")))
    if "wpe" in tr:
        hooks.append(tr.wpe.register_forward_hook(lambda m, a, o: out.__setitem__("pos", o)))
    hooks.append(tr.drop.register_forward_hook(save_output("x0")))
    for i, block in enumerate(tr.h):
        p = f"h{i}."
        hooks.append(block.ln_1.register_forward_hook(save_output(p + "ln_1")))
        hooks.append(block.attn.c_attn.register_forward_hook(save_output(p + "qkv")))
        hooks.append(block.attn.c_proj.register_forward_pre_hook(save_input(p + "concat")))
        hooks.append(block.attn.register_forward_hook(save_output(p + "attn_out")))
        # pre-norm: ln_2 reads x + attn; post-norm: ln_1 does
        first_norm_after_attn = block.ln_2 if model.config.norm_position == "pre" else block.ln_1
        hooks.append(first_norm_after_attn.register_forward_pre_hook(save_input(p + "resid_1")))
        hooks.append(block.ln_2.register_forward_hook(save_output(p + "ln_2")))
        hooks.append(block.mlp.c_fc.register_forward_hook(save_output(p + "mlp_pre")))
        hooks.append(block.mlp.c_proj.register_forward_pre_hook(save_input(p + "mlp_hidden")))
        hooks.append(block.mlp.register_forward_hook(save_output(p + "mlp_out")))
        hooks.append(block.register_forward_hook(save_output(p + "out")))
    if "ln_f" in tr:  # absent with final_norm off
        hooks.append(tr.ln_f.register_forward_hook(save_output("ln_f")))
    return hooks


def _attention_inside(model: GPT, out: dict[str, torch.Tensor], weights: list[torch.Tensor], T: int) -> None:
    """Per layer, what has no module boundary of its own, into `out`: Q, K, V per head (split
    from c_attn's output, turned by RoPE where the model uses it), the scores before and after the
    mask, the model's own attention weights, and each head's output."""
    cfg = model.config
    C, H = cfg.n_embd, cfg.n_head
    hs = C // H
    rope = (model.rope_cos[:T], model.rope_sin[:T]) if cfg.pos_embedding == "rope" else None
    for i in range(cfg.n_layer):
        p = f"h{i}."
        kv = cfg.kv_heads * hs  # C, or less when query heads share keys and values
        q, k, v = out.pop(p + "qkv").split((C, kv, kv), dim=-1)  # (T, C), (T, kv) twice, as the model splits them
        q = q.view(T, H, hs).transpose(0, 1)  # (H, T, hs)
        k, v = (t.view(T, cfg.kv_heads, hs).transpose(0, 1) for t in (k, v))  # (H_kv, T, hs)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        # each query head beside the key and value head of its group (the same heads without grouping)
        k, v = (t.repeat_interleave(H // cfg.kv_heads, dim=0) for t in (k, v))  # (H, T, hs)
        out[p + "q"], out[p + "k"], out[p + "v"] = q, k, v
        out[p + "scores"] = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (H, T, T), before the mask
        out[p + "mask"] = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        out[p + "masked_scores"] = out[p + "scores"].masked_fill(~out[p + "mask"], float("-inf"))
        out[p + "weights"] = weights[i][0]  # (H, T, T), from the model's own softmax
        out[p + "heads"] = out[p + "concat"].view(T, H, hs).transpose(0, 1)  # (H, T, hs)


@dataclass
class WalkStep:
    key: str
    title: str
    torch: np.ndarray
    numpy: np.ndarray
    max_diff: float


@dataclass
class Walkthrough:
    preset: str
    seed: int
    init: str
    ids: list[int]
    config: dict[str, Any]
    weights: dict[str, np.ndarray]  # the parameters, W_Q / W_K / W_V split out of c_attn
    steps: list[WalkStep] = field(default_factory=list)

    @property
    def max_diff(self) -> float:
        return max(s.max_diff for s in self.steps)


def walkthrough(ids: Sequence[int] = WALKTHROUGH_IDS, *, preset: str = "hand", seed: int = 0,
                init: str = "hand", dtype: torch.dtype = torch.float64) -> Walkthrough:
    """One forward pass of a tiny model, every intermediate computed twice: by the torch model
    and by the NumPy reference (scratchlm/reference/numpy_gpt.py), with the largest difference."""
    model = walkthrough_model(preset, seed, init, dtype)
    return walkthrough_of(model, ids, preset=preset, seed=seed, init=init)


def walkthrough_of(model: GPT, ids: Sequence[int], *, preset: str = "custom", seed: int = 0,
                   init: str = "model") -> Walkthrough:
    """The walkthrough of any (small) model: torch trace beside the NumPy reference's trace."""
    from scratchlm.reference.numpy_gpt import forward_trace, params_from_state_dict

    cfg = model.config
    ids = [int(i) for i in ids]
    if not ids or len(ids) > cfg.block_size:
        raise ValueError(f"give 1 to {cfg.block_size} token ids for the {preset} preset, got {len(ids)}")
    if any(not 0 <= i < cfg.vocab_size for i in ids):
        raise ValueError(f"token ids must be in 0..{cfg.vocab_size - 1} for the {preset} preset, got {ids}")
    state = model.state_dict()
    reference = forward_trace(np.array(ids), params_from_state_dict(state), cfg)
    ours = torch_trace(model, ids)
    weights = for_display(dict(model.named_parameters()), cfg.n_embd)  # a tied head appears once, as wte

    result = Walkthrough(preset, seed, init, ids, cfg.to_dict(), weights)
    for key, title in step_titles(cfg):
        result.steps.append(compare(key, title, ours[key], reference[key]))
    return result


_POSITION_TITLES = {
    "learned": _GLOBAL_STEPS[1][1],
    "sinusoidal": "sinusoidal position encodings PE[0..T-1], fixed (no weights)  (T, C)",
    "rope": "nothing is added for positions (RoPE rotates Q and K inside attention): zeros  (T, C)",
    "none": "no positions at all: zeros  (T, C)",
}


def step_titles(cfg: GPTConfig) -> list[tuple[str, str]]:
    """(trace key, title) of every station, in the order of the forward pass, each title saying
    what that station computes in this configuration."""
    pos = cfg.pos_embedding
    titles = {"pos": _POSITION_TITLES[pos]}
    if pos in ("rope", "none"):
        titles["x0"] = "x0 = token embeddings (no position vector is added)  (T, C): the block's input"
    post = cfg.norm_position == "post"
    block = dict(_BLOCK_STEPS) | (_POST_NORM_TITLES if post else {})
    width = {"mlp_pre": "4C" if cfg.n_inner is None else f"n_inner = {cfg.n_inner}"}
    width["mlp_hidden"] = width["mlp_pre"]
    if cfg.activation == "swiglu":  # c_fc's output is split into a gate half and a value half
        block["mlp_hidden"] = "SwiGLU: SiLU(gate half) * value half  (T, 4C)"
        width["mlp_hidden"] = "4C / 2" if cfg.n_inner is None else f"n_inner / 2 = {cfg.n_inner // 2}"
    steps = [(key, titles.get(key, title)) for key, title in _GLOBAL_STEPS]
    for i in range(cfg.n_layer):
        for key in _POST_NORM_ORDER if post else block:
            title = block[key].replace("(T, 4C)", f"(T, {width[key]})") if key in width else block[key]
            if pos == "rope" and key in ("q", "k"):
                title = title.replace(", split into heads", ", split into heads, then rotated by position (RoPE)")
            if key == "attn_out" and not cfg.proj_bias:
                title = title.replace(" + b_O", " (no bias)")
            steps.append((f"h{i}.{key}", f"block {i}: {title}"))
    final = _FINAL_STEPS if cfg.final_norm else _NO_FINAL_NORM_STEPS
    if not cfg.lm_head_bias:
        final = [(key, title.replace(" + b_lm", "")) for key, title in final]
    return steps + final


_FLOW_ORDER = ("transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f", "lm_head")


def for_display(arrays: dict[str, Any], C: int) -> dict[str, np.ndarray]:
    """Parameters (or their gradients) keyed by state-dict name, as NumPy arrays in the order the
    data flows through them, with c_attn's rows split into W_Q, W_K, W_V and attn.c_proj named W_O."""
    shown: dict[str, np.ndarray] = {}
    for name, value in sorted(arrays.items(), key=lambda kv: [kv[0].startswith(f) for f in _FLOW_ORDER].index(True)):
        # a copy: a parameter's numpy() shares its memory, and the training walk steps it in place
        array = value.detach().cpu().numpy().copy() if hasattr(value, "detach") else np.array(value)
        if name.endswith("attn.c_attn.weight"):  # rows are [W_Q; W_K; W_V]
            stem = name[: -len("c_attn.weight")]
            kv = (array.shape[0] - C) // 2  # C, or less under grouped-query attention
            shown[stem + "W_Q"], shown[stem + "W_K"], shown[stem + "W_V"] = array[:C], array[C : C + kv], array[C + kv :]
        elif name.endswith("attn.c_proj.weight"):
            shown[name[: -len("c_proj.weight")] + "W_O"] = array
        else:
            shown[name] = array
    return shown


def compare(key: str, title: str, torch_value: Any, numpy_value: Any) -> WalkStep:
    """One station computed twice, with the largest difference (-inf in both counts as none)."""
    a = torch_value.detach().cpu().numpy() if hasattr(torch_value, "detach") else np.asarray(torch_value)
    b = np.asarray(numpy_value)
    if a.shape != b.shape:
        raise AssertionError(f"{key}: torch shape {a.shape} but NumPy shape {b.shape}")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    same_inf = np.isinf(a64) & (a64 == b64)  # -inf where both mask the future: no difference
    with np.errstate(invalid="ignore"):  # -inf - -inf, replaced by 0 just above
        diff = float(np.max(np.where(same_inf, 0.0, np.abs(a64 - b64)))) if a.size else 0.0
    return WalkStep(key, title, a, b, diff)


def matrix_lines(a: np.ndarray, width: int = 8, exact: bool = False) -> list[str]:
    """Rows of a matrix (a vector is one row, a number a 1 x 1 matrix), four decimals; exact:
    three significant digits in e-notation, for gradients and updates far below 0.0001."""
    a = np.asarray(a)
    if a.dtype == bool:
        a = a.astype(np.int64)
    elif a.dtype.kind == "f" and not exact:
        a = np.where(np.abs(a) < 5e-5, 0.0, a)  # what prints as 0.0000 shows no sign
    a = a.reshape(1, -1) if a.ndim < 2 else a
    if a.dtype.kind != "f":
        return ["[" + " ".join(f"{x:>{width}d}" for x in row) + " ]" for row in a]
    spec = f">{width + 2}.2e" if exact else f">{width}.4f"
    return ["[" + " ".join(format(x, spec) for x in row) + " ]" for row in a]


def side_by_side(left: np.ndarray, right: np.ndarray, indent: str = "    ", exact: bool = False) -> list[str]:
    """Rows of the torch matrix and the NumPy matrix next to each other; (H, ...) per head."""
    if left.ndim == 3:
        lines = []
        for h in range(left.shape[0]):
            lines.append(f"{indent}head {h}:")
            lines += side_by_side(left[h], right[h], indent + "  ", exact)
        return lines
    a, b = matrix_lines(left, exact=exact), matrix_lines(right, exact=exact)
    pad = max(len(s) for s in a)
    return [f"{indent}{x:<{pad}}   {y}" for x, y in zip(a, b)]


def _kv_heads(cfg: dict[str, Any]) -> str:
    """`, H_kv=2` where query heads share key and value heads; nothing otherwise."""
    kv = cfg.get("n_kv_head")
    return "" if kv in (None, cfg["n_head"]) else f", H_kv={kv}"


def format_walkthrough(w: Walkthrough, labels: Sequence[str] | None = None) -> str:
    cfg = w.config
    drawn = "multiples of 0.1 in [-1, 1]" if w.init == "hand" else "the model's own initialisation"
    lines = [
        f"walkthrough: preset {w.preset}  (T={len(w.ids)}, C={cfg['n_embd']}, H={cfg['n_head']}{_kv_heads(cfg)}, "
        f"hs={cfg['n_embd'] // cfg['n_head']}, N={cfg['n_layer']}, V={cfg['vocab_size']}), seed {w.seed}, "
        f"weights: {drawn}",
        f"input ids: {w.ids}" + (f"  ({' '.join(labels[i] for i in w.ids)}; vocabulary: "
                                 f"{', '.join(f'{i} {t}' for i, t in enumerate(labels))})" if labels else ""),
        "",
        "weights (torch Linear layout: (out, in), so a layer computes x @ W^T + b):",
    ]
    for name, array in w.weights.items():
        lines.append(f"  {name}  {tuple(array.shape)}")
        lines += ["    " + s for s in matrix_lines(array)]
    lines += ["", "forward pass, torch (left) and NumPy reference (right):"]
    for s in w.steps:
        lines.append("")
        lines.append(f"  {s.key}: {s.title}   max |torch - numpy| = {s.max_diff:.1e}")
        lines += side_by_side(s.torch, s.numpy)
    lines += ["", f"largest difference over all steps: {w.max_diff:.3e}"]
    return "\n".join(lines)


def walkthrough_json(w: Walkthrough) -> dict[str, Any]:
    """The walkthrough as plain JSON data; a masked score (-inf) becomes null, since JSON has no
    infinities."""

    def lst(a: np.ndarray):
        if a.dtype == bool:
            return a.astype(np.int64).tolist()
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            return np.where(np.isfinite(a), a, None).tolist()
        return a.tolist()

    return {
        "preset": w.preset,
        "seed": w.seed,
        "init": w.init,
        "ids": w.ids,
        "config": w.config,
        "weights": {k: lst(v) for k, v in w.weights.items()},
        "steps": [
            {"key": s.key, "title": s.title, "torch": lst(s.torch), "numpy": lst(s.numpy), "max_diff": s.max_diff}
            for s in w.steps
        ],
        "max_diff": w.max_diff,
    }


_PER_HEAD = {"q", "k", "v", "scores", "masked_scores", "weights", "heads"}


def format_focus(w: Walkthrough, layer: int, head: int, labels: Sequence[str], top: list[tuple[int, str, float]],
                 source: str) -> str:
    """The walkthrough of a real (trained) model, readable: layer `layer`'s head `head` printed in
    full (its Q, K, V, scores, weights and output), every other station as one line with its shape
    and the largest |torch - numpy|, then the most likely next tokens. labels: one per input id;
    top: (id, label, probability) at the last position."""
    cfg = w.config
    lines = [f"walkthrough: {source}  (T={len(w.ids)}, C={cfg['n_embd']}, H={cfg['n_head']}{_kv_heads(cfg)}, "
             f"hs={cfg['n_embd'] // cfg['n_head']}, N={cfg['n_layer']}, V={cfg['vocab_size']}); layer {layer}, "
             f"head {head} in full, every other station as its shape and the largest |torch - numpy|",
             "input: " + "  ".join(f"{i} {label}" for i, label in zip(w.ids, labels)), "",
             "forward pass, torch (left) and NumPy reference (right):"]
    for s in w.steps:
        block, _, name = s.key.partition(".")
        if block == f"h{layer}" and name in _PER_HEAD:
            lines += ["", f"  {s.key}, head {head}: {s.title}   max |torch - numpy| = {s.max_diff:.1e}"]
            wide = s.torch.shape[-1] > 12  # a head's hs columns: torch's alone, NumPy's equal within the diff
            lines += ["    " + x for x in matrix_lines(s.torch[head])] if wide else side_by_side(s.torch[head], s.numpy[head])
            lines.append("")
        else:
            lines.append(f"  {s.key:<20} {str(tuple(s.torch.shape)):<14} max |torch - numpy| = {s.max_diff:.1e}")
    lines += ["", "next token at the last position (the most likely):"]
    lines += [f"  {i:>7} {label:<12} p = {p:.4f}" for i, label, p in top]
    lines += ["", f"largest difference over all steps: {w.max_diff:.3e}"]
    return "\n".join(lines)
