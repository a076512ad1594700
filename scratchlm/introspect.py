"""Looking inside a model: the shape of the data at every station, parameter / FLOP / memory
accounting, a hand-sized walkthrough of one forward pass, and attention maps.

Sections, in the order `scratchlm inspect` prints them:
  1. shape_trace       the data flow with shapes, read off forward hooks on the real modules (S1, S11)
  2. param_table       exact parameter counts per component beside the seed's 12 N C^2 + 2 V C (S10)
  3. flops_per_token   matmul FLOPs per token, forward and training
  4. memory_estimate   bytes for training: weights, gradients, AdamW state, activations
Then `walkthrough` (S23: every matrix of one tiny forward pass, torch beside the NumPy reference)
and `attention_figure` (S19: heatmaps of the explicit path's attention weights).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from scratchlm.config import GPTConfig
from scratchlm.fileio import atomic_write
from scratchlm.flops import count_params, flops_per_token, si_units
from scratchlm.model import GPT, apply_rope, eval_mode

# --------------------------------------------------------------------------------------------
# 1. Parameters
# --------------------------------------------------------------------------------------------


@dataclass
class ParamRow:
    component: str
    exact: int
    estimate: int  # the seed's 12*N*C^2 + 2*V*C, split over the components it covers


def param_table(model: GPT) -> list[ParamRow]:
    """Exact parameter counts per component beside the seed's estimate (S10).

    The estimate gives each block 12 C^2 (attention 4 C^2: W_Q, W_K, W_V, W_O; MLP 8 C^2: C x 4C
    twice) and each of the token embedding and lm_head V C; it ignores biases, norms and the
    position table. A tied lm_head has no parameters of its own (counted once, in the embedding).
    """
    cfg = model.config
    C, V = cfg.n_embd, cfg.vocab_size

    def count(module) -> int:
        return sum(p.numel() for p in module.parameters())

    rows = [ParamRow("token embedding wte", count(model.transformer.wte), V * C)]
    if "wpe" in model.transformer:
        rows.append(ParamRow("position embedding wpe", count(model.transformer.wpe), 0))
    for i, block in enumerate(model.transformer.h):
        rows.append(ParamRow(f"block {i} attention", count(block.attn), 4 * C * C))
        rows.append(ParamRow(f"block {i} mlp", count(block.mlp), 8 * C * C))
        rows.append(ParamRow(f"block {i} norms", count(block.ln_1) + count(block.ln_2), 0))
    rows.append(ParamRow("final norm ln_f", count(model.transformer.ln_f), 0))
    head = model.lm_head.bias.numel() if model.lm_head.bias is not None else 0
    if not cfg.tie_weights:
        head += model.lm_head.weight.numel()
    rows.append(ParamRow("lm_head" + (" (tied to wte)" if cfg.tie_weights else ""), head, V * C))
    return rows


def seed_estimate(cfg: GPTConfig) -> int:
    """The seed's closed-form estimate 12 N C^2 + 2 V C (untied, no biases or norms)."""
    return 12 * cfg.n_layer * cfg.n_embd**2 + 2 * cfg.vocab_size * cfg.n_embd


# --------------------------------------------------------------------------------------------
# 2. Shapes along the data flow
# --------------------------------------------------------------------------------------------


@dataclass
class Station:
    name: str
    shape: tuple[int, ...]


@torch.no_grad()
def shape_trace(model: GPT, batch_size: int = 2, seq_len: int = 16, seed: int = 0) -> list[Station]:
    """Run a random (B, T) batch through the model and record the shape after every station.

    The shapes are read off forward hooks on the real modules, so this cannot drift from what
    the model does.
    """
    cfg = model.config
    if seq_len > cfg.block_size:
        raise ValueError(f"seq_len {seq_len} exceeds block_size {cfg.block_size}")
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (batch_size, seq_len), generator=gen)
    idx = idx.to(next(model.parameters()).device)
    stations = [Station("ids", tuple(idx.shape))]
    hooks = []

    def record(name):
        def hook(module, args, output):
            stations.append(Station(name, tuple(output.shape)))

        return hook

    hooks.append(model.transformer.wte.register_forward_hook(record("token embedding wte(ids)")))
    if "wpe" in model.transformer:
        hooks.append(model.transformer.wpe.register_forward_hook(record("position embedding wpe(arange(T))")))
    hooks.append(model.transformer.drop.register_forward_hook(record("embedding sum (tokens + positions)")))
    for i, block in enumerate(model.transformer.h):
        hooks.append(block.attn.register_forward_hook(record(f"block {i} attention output")))
        hooks.append(block.mlp.register_forward_hook(record(f"block {i} mlp output")))
        hooks.append(block.register_forward_hook(record(f"block {i} output")))
    hooks.append(model.transformer.ln_f.register_forward_hook(record("final norm ln_f")))
    hooks.append(model.lm_head.register_forward_hook(record("logits lm_head")))
    with eval_mode(model):
        try:
            model(idx)
        finally:
            for h in hooks:
                h.remove()
    return stations


# --------------------------------------------------------------------------------------------
# 3. FLOPs
# --------------------------------------------------------------------------------------------




# --------------------------------------------------------------------------------------------
# 4. Training memory
# --------------------------------------------------------------------------------------------

PRECISIONS = ("fp32", "bf16-mixed")
_DTYPE_BYTES = {"f32": 4, "i64": 8, "bool": 1}


def saved_activations(cfg: GPTConfig, batch_size: int, seq_len: int, attention: str = "sdpa") -> list[tuple[str, int, str]]:
    """The tensors autograd keeps from the forward pass for the backward pass, as
    (what, number of elements, kind). kind is `act` (matmul inputs and outputs: fp32, or bf16
    under autocast), `res` (the residual stream and norm inputs, fp32 in both precisions, since
    embeddings and master weights are fp32), `f32` (statistics kept in fp32: norm mean/rstd,
    attention log-sum-exp, log-probabilities), `i64` or `bool`.

    Derived op by op from what each backward formula needs (a Linear needs its input, ReLU its
    output, GELU its input and output, LayerNorm its input, mean and 1/std, ...), counting a
    tensor once however many ops keep it (e.g. q, k and v are views of one c_attn output). The
    list follows PyTorch's kernels on the CPU; the tests compare it with what autograd really
    saves. Dropout masks (dropout > 0) are not included.
    """
    B, T, C, H, N, V = batch_size, seq_len, cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.vocab_size
    BT, hidden = B * T, cfg.mlp_hidden

    def norm_saves(where: str) -> list[tuple[str, int, str]]:
        rows = [(f"{where} input", BT * C, "res")]
        if cfg.norm == "layernorm":
            rows.append((f"{where} mean and 1/std", 2 * BT, "f32"))
        else:  # x * rsqrt(mean(x^2)) * gamma: the multiply by gamma keeps the normalised x
            rows += [(f"{where} 1/rms", BT, "f32"), (f"{where} normalised x", BT * C, "res")]
        return rows

    block: list[tuple[str, int, str]] = []
    block += norm_saves("norm 1")
    block.append(("c_attn input", BT * C, "act"))
    if attention == "sdpa":
        block.append(("q, k, v (c_attn output)", 3 * BT * C, "act"))
        if cfg.pos_embedding == "rope":
            block.append(("q, k after rope", 2 * BT * C, "act"))
            # a contiguous (B, H, T, hs) query gives an output in that layout, so c_proj's
            # input becomes a copy after transpose(1, 2).contiguous()
            block.append(("c_proj input (heads merged)", BT * C, "act"))
        block.append(("attention output", BT * C, "act"))
        block.append(("attention log-sum-exp", B * H * T, "f32"))
    else:  # the explicit path keeps the whole (T, T) weight matrix of every head
        block.append(("q, k, v (contiguous copies)", 3 * BT * C, "act"))
        block.append(("causal mask", T * T, "bool"))
        block.append(("attention weights", B * H * T * T, "act"))
        block.append(("c_proj input (heads merged)", BT * C, "act"))
    block += norm_saves("norm 2")
    block.append(("c_fc input", BT * C, "act"))
    if cfg.activation == "relu":
        block.append(("relu output", BT * hidden, "act"))
    elif cfg.activation in ("gelu", "gelu_tanh"):
        block.append(("gelu input and output", 2 * BT * hidden, "act"))
    else:
        block.append(("c_fc output, silu(gate), silu(gate) * value", 2 * BT * hidden, "act"))

    rows = [("ids", BT, "i64")]
    if cfg.pos_embedding == "learned":
        rows.append(("positions arange(T)", T, "i64"))
    if cfg.pos_embedding == "rope":
        rows.append(("rope cos and sin tables", cfg.block_size * cfg.head_dim, "f32"))
    rows += [(f"block {i}: {what}", n, kind) for i in range(N) for what, n, kind in block]
    rows += norm_saves("ln_f")
    rows += [("lm_head input", BT * C, "act"), ("log-probabilities", BT * V, "f32"), ("targets", BT, "i64"),
             ("loss weight", 1, "f32")]
    return rows


def _bytes(rows: list[tuple[str, int, str]], act_bytes: int) -> int:
    sizes = dict(_DTYPE_BYTES, act=act_bytes, res=4)
    return sum(n * sizes[kind] for _, n, kind in rows)


@dataclass
class MemoryEstimate:
    """Bytes for one training step with AdamW at (batch_size, seq_len) in one precision."""

    precision: str
    batch_size: int
    seq_len: int
    weights: int
    weight_copies: int  # bf16 copies of the matmul weights that autocast keeps during the step
    gradients: int
    adamw_state: int
    activations: int
    activations_checkpointed: int
    loss_temporaries: int  # gradients of the log-probabilities and of the logits, B*T*V each, during backward
    total: int = 0
    total_checkpointed: int = 0

    def __post_init__(self):
        fixed = self.weights + self.weight_copies + self.gradients + self.adamw_state + self.loss_temporaries
        self.total = fixed + self.activations
        self.total_checkpointed = fixed + self.activations_checkpointed


def memory_estimate(cfg: GPTConfig, batch_size: int, seq_len: int, precision: str = "fp32",
                    attention: str = "sdpa") -> MemoryEstimate:
    """Training memory: weights, gradients, AdamW's two moments, and the activations kept for the
    backward pass, with and without activation checkpointing.

    fp32: everything 4 bytes. bf16-mixed (torch.autocast with fp32 master weights): weights,
    gradients and AdamW state stay fp32, autocast adds a bf16 copy of each matmul weight, and
    matmul inputs/outputs are kept in bf16 (2 bytes); the residual stream and statistics stay fp32.
    With checkpointing only each block's input is kept; during the backward pass one block at a
    time is recomputed, so one block's activations come back on top.
    The loss adds two short-lived B*T*V buffers during backward (loss_temporaries, derived, not
    measured). Not included: the CUDA context, allocator slack, other short-lived buffers and
    torch.compile's workspace, so leave some headroom.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    act = 4 if precision == "fp32" else 2
    counts = count_params(cfg)
    rows = saved_activations(cfg, batch_size, seq_len, attention)
    full = _bytes(rows, act)
    one_block = _bytes([r for r in rows if r[0].startswith("block 0:")], act)
    block_inputs = cfg.n_layer * batch_size * seq_len * cfg.n_embd * 4  # the residual stream, fp32
    checkpointed = full - cfg.n_layer * one_block + block_inputs + one_block
    P = counts["total"]
    return MemoryEstimate(
        precision=precision,
        batch_size=batch_size,
        seq_len=seq_len,
        weights=4 * P,
        weight_copies=0 if precision == "fp32" else 2 * counts["matmul"],
        gradients=4 * P,
        adamw_state=2 * 4 * P,
        activations=full,
        activations_checkpointed=checkpointed,
        # the backward of log_softmax holds its incoming gradient (fp32) and writes the logits'
        # gradient (fp32, or bf16 after autocast's cast back): short-lived but at the peak
        loss_temporaries=batch_size * seq_len * cfg.vocab_size * (4 + act),
    )


# --------------------------------------------------------------------------------------------
# The inspect report
# --------------------------------------------------------------------------------------------


def inspect_report(model: GPT, batch_size: int = 2, seq_len: int = 16, train_batch: int = 8,
                   train_seq_len: int | None = None) -> dict[str, Any]:
    """Everything `scratchlm inspect` shows, as plain data (what `--json` prints)."""
    cfg = model.config
    T_train = cfg.block_size if train_seq_len is None else train_seq_len
    rows = param_table(model)
    total = sum(r.exact for r in rows)
    flops = flops_per_token(cfg, T_train)
    return {
        "config": cfg.to_dict(),
        "trace": {
            "batch_size": batch_size,
            "seq_len": seq_len,
            "stations": [{"name": s.name, "shape": list(s.shape)} for s in shape_trace(model, batch_size, seq_len)],
        },
        "parameters": {
            "rows": [asdict(r) | {"difference": r.exact - r.estimate} for r in rows],
            "total": total,
            "seed_estimate": seed_estimate(cfg),
            "difference": total - seed_estimate(cfg),
            "without_embeddings": model.num_params(embeddings=False),
        },
        "flops_per_token": asdict(flops) | {
            "formula": "forward = 2*N_matmul + 4*n_layer*T*C; training = 3*forward",
        },
        "memory": {
            "batch_size": train_batch,
            "seq_len": T_train,
            "optimizer": "AdamW",
            "estimates": [asdict(memory_estimate(cfg, train_batch, T_train, p)) for p in PRECISIONS],
        },
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:,.3f} GiB"


def format_report(report: dict[str, Any]) -> str:
    """The human-readable text of an inspect_report."""
    lines = ["model config:"]
    for key, value in report["config"].items():
        lines.append(f"  {key:<14} {value}")

    tr = report["trace"]
    lines += ["", f"data flow for a random batch, B={tr['batch_size']}, T={tr['seq_len']}:"]
    for st in tr["stations"]:
        lines.append(f"  {st['name']:<40} {tuple(st['shape'])}")

    pr = report["parameters"]
    lines += ["", "parameters:", f"  {'component':<32} {'exact':>14} {'seed estimate':>14} {'difference':>12}"]
    for r in pr["rows"]:
        lines.append(f"  {r['component']:<32} {r['exact']:>14,} {r['estimate']:>14,} {r['difference']:>12,}")
    lines.append(f"  {'total':<32} {pr['total']:>14,} {pr['seed_estimate']:>14,} {pr['difference']:>12,}")
    lines.append(f"  without embedding tables: {pr['without_embeddings']:,}")
    lines.append("  seed estimate: 12*N*C^2 + 2*V*C (no biases, norms or position table)")

    fl = report["flops_per_token"]
    lines += ["", f"FLOPs per token at context T={fl['seq_len']} (matmuls only; 1 multiply-add = 2 FLOPs):"]
    for label, value in (
        (f"weights    2 * N_matmul (N_matmul = {fl['matmul_params']:,})", fl["forward_weights"]),
        ("attention  4 * n_layer * T * C", fl["forward_attention"]),
        ("forward    weights + attention", fl["forward"]),
        ("training   3 * forward (backward = 2 x forward)", fl["training"]),
        ("rule of thumb: 6 * N (N without embeddings)", fl["six_n"]),
    ):
        lines.append(f"  {label:<52}{si_units(value):>10}FLOP")

    mem = report["memory"]
    est = {e["precision"]: e for e in mem["estimates"]}
    lines += ["", f"training memory at B={mem['batch_size']}, T={mem['seq_len']} with AdamW (estimate):",
              f"  {'':<38}" + "".join(f"{p:>16}" for p in PRECISIONS)]
    for key, label in (
        ("weights", "weights (fp32)"),
        ("weight_copies", "bf16 weight copies (autocast)"),
        ("gradients", "gradients (fp32)"),
        ("adamw_state", "AdamW moments m, v (fp32)"),
        ("activations", "activations"),
        ("activations_checkpointed", "activations, checkpointing"),
        ("loss_temporaries", "loss gradients (B*T*V, at backward)"),
        ("total", "total"),
        ("total_checkpointed", "total with checkpointing"),
    ):
        lines.append(f"  {label:<38}" + "".join(f"{_gib(est[p][key]):>16}" for p in PRECISIONS))
    lines.append("  not included: CUDA context, allocator slack, torch.compile workspace; keep ~10-20% headroom")
    return "\n".join(lines)


def format_inspect(model: GPT, batch_size: int = 2, seq_len: int = 16, train_batch: int = 8,
                   train_seq_len: int | None = None) -> str:
    """The human-readable report printed by `scratchlm inspect`."""
    return format_report(inspect_report(model, batch_size, seq_len, train_batch, train_seq_len))


# --------------------------------------------------------------------------------------------
# 5. The hand-sized walkthrough (S23)
# --------------------------------------------------------------------------------------------

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
_FINAL_STEPS = [
    ("ln_f", "final norm ln_f  (T, C)"),
    ("logits", "logits = ln_f W_lm^T + b_lm  (T, V)"),
    ("probs", "probabilities = softmax(logits) per row  (T, V)"),
]


def walkthrough_model(preset: str = "hand", seed: int = 0, init: str = "hand",
                      dtype: torch.dtype = torch.float64) -> GPT:
    """The preset's model with weights a learner can multiply by hand.

    init "hand": every entry of every weight matrix and embedding table drawn uniformly from
    -1.0, -0.9, ..., 1.0 (one decimal), biases 0, norm gamma 1 and beta 0. The model's own init
    would give embeddings of about 0.02, which print as 0.0000. init "model": the model's own
    initialisation, unrounded.
    """
    if init not in ("hand", "model"):
        raise ValueError(f"init must be 'hand' or 'model', got {init!r}")
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_name(preset)).to(dtype).eval()
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
    cfg = model.config
    idx = torch.tensor([list(ids)], dtype=torch.long, device=next(model.parameters()).device)  # (1, T)
    T, C, H = idx.shape[1], cfg.n_embd, cfg.n_head
    hs = C // H
    out: dict[str, torch.Tensor] = {}
    hooks = []

    def save_output(key):
        return lambda module, args, output: out.__setitem__(key, output[0])

    def save_input(key):
        return lambda module, args: out.__setitem__(key, args[0][0])

    tr = model.transformer
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
        first_norm_after_attn = block.ln_2 if cfg.norm_position == "pre" else block.ln_1
        hooks.append(first_norm_after_attn.register_forward_pre_hook(save_input(p + "resid_1")))
        hooks.append(block.ln_2.register_forward_hook(save_output(p + "ln_2")))
        hooks.append(block.mlp.c_fc.register_forward_hook(save_output(p + "mlp_pre")))
        hooks.append(block.mlp.c_proj.register_forward_pre_hook(save_input(p + "mlp_hidden")))
        hooks.append(block.mlp.register_forward_hook(save_output(p + "mlp_out")))
        hooks.append(block.register_forward_hook(save_output(p + "out")))
    hooks.append(tr.ln_f.register_forward_hook(save_output("ln_f")))
    weights: list[torch.Tensor] = []
    try:
        logits, _ = model(idx, attn_weights=weights)  # a list here switches on the explicit path
    finally:
        for h in hooks:
            h.remove()

    if "pos" not in out:  # sinusoidal, rope or none: whatever was added to the token embeddings
        out["pos"] = out["x0"] - out["wte"]
    rope = None
    if cfg.pos_embedding == "rope":
        rope = (model.rope_cos[:T], model.rope_sin[:T])
    for i in range(cfg.n_layer):
        p = f"h{i}."
        q, k, v = out.pop(p + "qkv").split(C, dim=-1)  # (T, C) each, as the model splits them
        q, k, v = (t.view(T, H, hs).transpose(0, 1) for t in (q, k, v))  # (H, T, hs)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out[p + "q"], out[p + "k"], out[p + "v"] = q, k, v
        out[p + "scores"] = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (H, T, T), before the mask
        out[p + "mask"] = torch.ones(T, T, dtype=torch.bool).tril()
        out[p + "masked_scores"] = out[p + "scores"].masked_fill(~out[p + "mask"], float("-inf"))
        out[p + "weights"] = weights[i][0]  # (H, T, T), from the model's own softmax
        out[p + "heads"] = out[p + "concat"].view(T, H, hs).transpose(0, 1)  # (H, T, hs)
    out["logits"] = logits[0]
    out["probs"] = F.softmax(logits[0], dim=-1)
    return {key: value.detach().cpu().numpy() for key, value in out.items()}


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

    weights: dict[str, np.ndarray] = {}
    C = cfg.n_embd
    flow_order = ("transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f", "lm_head")
    for name, tensor in sorted(state.items(), key=lambda kv: [kv[0].startswith(f) for f in flow_order].index(True)):
        array = tensor.detach().cpu().numpy()
        if name.endswith("attn.c_attn.weight"):  # rows are [W_Q; W_K; W_V]
            stem = name[: -len("c_attn.weight")]
            weights[stem + "W_Q"], weights[stem + "W_K"], weights[stem + "W_V"] = array[:C], array[C : 2 * C], array[2 * C :]
        elif name.endswith("attn.c_proj.weight"):
            weights[name[: -len("c_proj.weight")] + "W_O"] = array
        else:
            weights[name] = array
    if cfg.tie_weights:
        weights.pop("lm_head.weight", None)

    steps = list(_GLOBAL_STEPS)
    for i in range(cfg.n_layer):
        steps += [(f"h{i}.{key}", f"block {i}: {title}") for key, title in _BLOCK_STEPS]
    steps += _FINAL_STEPS
    result = Walkthrough(preset, seed, init, ids, cfg.to_dict(), weights)
    for key, title in steps:
        a, b = ours[key], np.asarray(reference[key])
        if a.shape != b.shape:
            raise AssertionError(f"{key}: torch shape {a.shape} but NumPy shape {b.shape}")
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        same_inf = np.isinf(a64) & (a64 == b64)  # -inf where both mask the future: no difference
        with np.errstate(invalid="ignore"):  # -inf - -inf, replaced by 0 just above
            diff = float(np.max(np.where(same_inf, 0.0, np.abs(a64 - b64)))) if a.size else 0.0
        result.steps.append(WalkStep(key, title, a, b, diff))
    return result


def _matrix_lines(a: np.ndarray, width: int = 8) -> list[str]:
    if a.dtype == bool:
        a = a.astype(np.int64)
    elif a.dtype.kind == "f":
        a = np.where(np.abs(a) < 5e-5, 0.0, a)  # what prints as 0.0000 shows no sign
    if a.ndim == 1:
        a = a[None, :]
    return ["[" + " ".join(f"{x:>{width}.4f}" if a.dtype.kind == "f" else f"{x:>{width}d}" for x in row) + " ]" for row in a]


def _side_by_side(left: np.ndarray, right: np.ndarray, indent: str = "    ") -> list[str]:
    """Rows of the torch matrix and the NumPy matrix next to each other; (H, ...) per head."""
    if left.ndim == 3:
        lines = []
        for h in range(left.shape[0]):
            lines.append(f"{indent}head {h}:")
            lines += _side_by_side(left[h], right[h], indent + "  ")
        return lines
    a, b = _matrix_lines(left), _matrix_lines(right)
    pad = max(len(s) for s in a)
    return [f"{indent}{x:<{pad}}   {y}" for x, y in zip(a, b)]


def format_walkthrough(w: Walkthrough) -> str:
    cfg = w.config
    drawn = "multiples of 0.1 in [-1, 1]" if w.init == "hand" else "the model's own initialisation"
    lines = [
        f"walkthrough: preset {w.preset}  (T={len(w.ids)}, C={cfg['n_embd']}, H={cfg['n_head']}, "
        f"hs={cfg['n_embd'] // cfg['n_head']}, N={cfg['n_layer']}, V={cfg['vocab_size']}), seed {w.seed}, "
        f"weights: {drawn}",
        f"input ids: {w.ids}",
        "",
        "weights (torch Linear layout: (out, in), so a layer computes x @ W^T + b):",
    ]
    for name, array in w.weights.items():
        lines.append(f"  {name}  {tuple(array.shape)}")
        lines += ["    " + s for s in _matrix_lines(array)]
    lines += ["", "forward pass, torch (left) and NumPy reference (right):"]
    for s in w.steps:
        lines.append("")
        lines.append(f"  {s.key}: {s.title}   max |torch - numpy| = {s.max_diff:.1e}")
        lines += _side_by_side(s.torch, s.numpy)
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


# --------------------------------------------------------------------------------------------
# 6. Attention maps (S19)
# --------------------------------------------------------------------------------------------

# families that cover Chinese (and Japanese/Korean) ideographs, most wanted first
_CJK_FAMILIES = (
    "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC",
    "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Droid Sans Fallback", "Microsoft YaHei", "SimHei",
    "PingFang SC", "Hiragino Sans GB", "Noto Serif CJK SC", "AR PL UMing CN",
)
_CJK_FILE_HINTS = ("cjk", "wqy", "wenquanyi", "droidsansfallback", "sourcehan", "yahei", "simhei", "pingfang", "uming")


@torch.no_grad()
def attention_weights(model: GPT, ids: Sequence[int]) -> list[np.ndarray]:
    """Each layer's attention weights (H, T, T) for one sequence, from the explicit path."""
    device = next(model.parameters()).device
    idx = torch.tensor([list(ids)], dtype=torch.long, device=device)  # (1, T)
    weights: list[torch.Tensor] = []
    with eval_mode(model):
        model(idx, attn_weights=weights)
    return [w[0].float().cpu().numpy() for w in weights]


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """One axis label per token: each id decoded on its own, whitespace made visible."""
    labels = []
    for i in ids:
        try:
            text = tokenizer.decode([int(i)])
        except Exception:  # a byte-level piece alone may not be valid text
            text = f"<{int(i)}>"
        text = text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
        labels.append(text or f"<{int(i)}>")
    return labels


def _font_covers(path: str, chars: set[str]) -> bool:
    from matplotlib.ft2font import FT2Font

    try:
        charmap = FT2Font(path).get_charmap()
    except Exception:  # an unreadable font file is just not a candidate
        return False
    return all(ord(c) in charmap for c in chars)


def find_font_for(text: str) -> str | None:
    """A font family whose glyphs cover every non-ASCII character of `text`: matplotlib's default
    (DejaVu Sans) when it does, else an installed CJK font. None when no installed font does.

    Looks at the fonts matplotlib knows and, since its font cache may predate a newly installed
    package, at the font files on the system, registering a match with matplotlib.
    """
    from matplotlib import font_manager

    chars = {c for c in text if ord(c) > 127}
    default = font_manager.findfont("DejaVu Sans", fallback_to_default=True)
    if _font_covers(default, chars):
        return "DejaVu Sans"
    known = {f.name: f.fname for f in font_manager.fontManager.ttflist}
    candidates = [known[name] for name in _CJK_FAMILIES if name in known]
    candidates += [f.fname for f in font_manager.fontManager.ttflist if any(h in f.fname.lower() for h in _CJK_FILE_HINTS)]
    candidates += [p for p in font_manager.findSystemFonts() if any(h in os.path.basename(p).lower() for h in _CJK_FILE_HINTS)]
    for path in dict.fromkeys(candidates):
        if _font_covers(path, chars):
            font_manager.fontManager.addfont(path)
            # a .ttc holds several faces (JP, SC, ...); prefer the Chinese one when it is there
            faces = {f.name for f in font_manager.fontManager.ttflist if f.fname == path}
            preferred = [name for name in _CJK_FAMILIES if name in faces]
            return preferred[0] if preferred else font_manager.FontProperties(fname=path).get_name()
    return None


def attention_figure(weights: list[np.ndarray], labels: Sequence[str], *, layers: Sequence[int] | None = None,
                     heads: Sequence[int] | None = None, panel_inches: float = 3.0, dpi: int = 100):
    """A grid of heatmaps, one row per selected layer and one column per selected head.

    weights: per layer (H, T, T) with rows = queries, columns = keys. Returns the matplotlib
    Figure; its size is (len(heads) * panel_inches, len(layers) * panel_inches) inches at `dpi`.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    n_layer, n_head = len(weights), weights[0].shape[0]
    layers = list(range(n_layer)) if layers is None else list(layers)
    heads = list(range(n_head)) if heads is None else list(heads)
    for name, chosen, n in (("layer", layers, n_layer), ("head", heads, n_head)):
        bad = [i for i in chosen if not 0 <= i < n]
        if bad:
            raise ValueError(f"{name} {bad[0]} does not exist; the model has {n} (0..{n - 1})")
    family = find_font_for("".join(labels))
    missing_glyphs = family is None
    if missing_glyphs:
        warnings.warn(
            "no installed font has glyphs for every token label; some labels will show as boxes "
            "(install a CJK font, e.g. `apt-get install fonts-noto-cjk`)",
            stacklevel=2,
        )
        family = "DejaVu Sans"
    fonts = list(dict.fromkeys([family, "DejaVu Sans"]))  # per-glyph fallback for the symbols
    fig = Figure(figsize=(len(heads) * panel_inches, len(layers) * panel_inches), dpi=dpi)
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    T = len(labels)
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(weights[layer][head], vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(f"layer {layer}, head {head}", fontsize=9)
            ax.set_xticks(range(T), labels, fontfamily=fonts, fontsize=8, rotation=90)
            ax.set_yticks(range(T), labels, fontfamily=fonts, fontsize=8)
            if c == 0:
                ax.set_ylabel("query (row)", fontsize=8)
            if r == len(layers) - 1:
                ax.set_xlabel("key (column)", fontsize=8)
    with warnings.catch_warnings():
        if missing_glyphs:  # already said once above; layout measures every label again
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        fig.tight_layout()
    return fig


def save_figure(fig, out: str | os.PathLike) -> Path:
    """Write the figure as PNG, whole or not at all (scratchlm.fileio.atomic_write)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out) as f, warnings.catch_warnings():
        # find_font_for already warned once if a glyph is missing; don't repeat per label
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        fig.savefig(f, format="png", dpi=fig.dpi)
    return out
