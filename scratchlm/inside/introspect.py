"""Looking inside a model: the shape of the data at every station, parameter / FLOP / memory
accounting, a hand-sized walkthrough of one forward pass, and attention maps.

Sections, in the order `scratchlm inspect` prints them:
  1. shape_trace       the data flow with shapes, read off forward hooks on the real modules (stations 5-13)
  2. param_table       exact parameter counts per component beside the seed's 12 N C^2 + 2 V C (station 14)
  3. flops_per_token   matmul FLOPs per token, forward and training
  4. memory_estimate   bytes for training: weights, gradients, AdamW state, activations
The hand-sized walkthrough is scratchlm.inside.walkthrough, the attention pictures
scratchlm.inside.attention_maps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from scratchlm.machine.flops import count_params, flops_per_token, si_units
from scratchlm.machine.training_memory import PRECISIONS, MemoryEstimate, memory_estimate, saved_activations  # noqa: F401
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT, eval_mode

# --------------------------------------------------------------------------------------------
# 1. Parameters
# --------------------------------------------------------------------------------------------


@dataclass
class ParamRow:
    component: str
    exact: int
    estimate: int  # the seed's 12*N*C^2 + 2*V*C, split over the components it covers


def param_table(model: GPT) -> list[ParamRow]:
    """Exact parameter counts per component beside the seed's estimate (station 14).

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
    if "ln_f" in model.transformer:  # absent with final_norm off
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
    if "ln_f" in model.transformer:
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
# 4. Training memory: scratchlm.machine.training_memory (imported above), printed here
# --------------------------------------------------------------------------------------------


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
    lines += ["", f"training memory at B={mem['batch_size']}, T={mem['seq_len']} with AdamW (estimate, for the plain "
                  "loss, --no-fused_loss; from 1M scores on the default fused loss never holds the B*T*V rows below):",
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
