"""Looking inside a model: parameter accounting and the shape of the data at every station."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scratchlm.config import GPTConfig
from scratchlm.model import GPT


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
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return stations


def format_inspect(model: GPT, batch_size: int = 2, seq_len: int = 16) -> str:
    """The human-readable report printed by `scratchlm inspect`."""
    cfg = model.config
    lines = []
    lines.append("model config:")
    for key, value in cfg.to_dict().items():
        lines.append(f"  {key:<14} {value}")
    lines.append("")
    lines.append(f"data flow for a random batch, B={batch_size}, T={seq_len}:")
    for st in shape_trace(model, batch_size, seq_len):
        lines.append(f"  {st.name:<40} {str(st.shape)}")
    lines.append("")
    lines.append("parameters:")
    lines.append(f"  {'component':<32} {'exact':>14} {'seed estimate':>14} {'difference':>12}")
    rows = param_table(model)
    for r in rows:
        lines.append(f"  {r.component:<32} {r.exact:>14,} {r.estimate:>14,} {r.exact - r.estimate:>12,}")
    total = sum(r.exact for r in rows)
    est = seed_estimate(cfg)
    lines.append(f"  {'total':<32} {total:>14,} {est:>14,} {total - est:>12,}")
    lines.append(f"  without embedding tables: {model.num_params(embeddings=False):,}")
    return "\n".join(lines)
