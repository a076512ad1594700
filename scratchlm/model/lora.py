"""LoRA (low-rank adaptation): fine-tune a trained model by learning a small change to some of its
matrices while the matrices themselves stay frozen.

A Linear computes y = x W^T + b with W of shape (d_out, d_in). LoRA keeps W and learns two thin
matrices, A (r, d_in) and B (d_out, r), with r much smaller than d_in and d_out:

    y = x W^T + b + (alpha / r) * (x A^T) B^T          the change to W is (alpha / r) * B A, rank <= r

    trainable numbers per matrix    r * (d_in + d_out), instead of d_in * d_out
    A                               random (Kaiming-uniform, as nn.Linear starts), so each of the r
                                    directions it reads is a different one
    B                               zeros: at step 0 the change B A is exactly zero, so the adapted
                                    model computes exactly what the base computes; training moves B first
    alpha / r                       a fixed scale, so changing r does not change how large a step of
                                    the same learning rate moves the output

After training the change can be added into W once (`merge_lora`: W + (alpha / r) B A), giving a
plain model of the base's shape that computes the same outputs (to float rounding) with no extra
work per token: generation, the fast decoding paths and every exporter read that merged model.

A fine-tune that taught the tokenizer new ids (the chat template's tokens) must also learn their
rows of the token embedding and the output head: `train_new_rows` leaves the old rows frozen and
makes only the new ones a parameter, for the embedding and for a tied or untied head alike. Neither
makes a (V, C) matrix for a step: the embedding looks a new id up in the new rows, and the
training loss reads the head as its two blocks of rows, making a gradient for the new block
only (for GPT-2's 50,257 ids and width 768 a (V, C) float32 matrix is 154 MB, and a whole head's
gradient would be two more of them).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
"""The block matrices LoRA can adapt, as each block names them (W_QKV, W_O, the MLP's two)."""


class LoRALinear(nn.Module):
    """A frozen nn.Linear (`base`) plus the trainable low-rank change (alpha / r) B A (see the module)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base, self.rank, self.alpha = base, rank, alpha
        self.scale = alpha / rank
        base.requires_grad_(False)
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=w.device, dtype=w.dtype))  # (r, d_in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=w.device, dtype=w.dtype))  # (d_out, r)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear initialises its weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., d_in) -> (..., r) -> (..., d_out): the change costs r * (d_in + d_out) per row, never d_in * d_out
        return self.base(x) + (x @ self.lora_A.t()) @ self.lora_B.t() * self.scale

    def delta(self) -> torch.Tensor:
        """(d_out, d_in): the change to W, (alpha / r) B A."""
        return (self.lora_B @ self.lora_A) * self.scale


class NewRows(nn.Module):
    """The trainable rows `start`.. of a (V, C) table; called on the table, the whole of it: its
    first `start` rows, frozen, followed by these."""

    def __init__(self, weight: torch.Tensor, start: int):
        super().__init__()
        self.start = start
        self.rows = nn.Parameter(weight[start:].detach().clone())  # (V - start, C)

    def forward(self, original: torch.Tensor) -> torch.Tensor:
        return torch.cat([original[: self.start].detach(), self.rows], dim=0)  # (V, C)


class NewRowsEmbedding(nn.Module):
    """The token embedding with trainable new rows: a new id's vector is looked up in them, every
    other id's in the frozen table, so no (V, C) matrix is made for a step, nor a gradient of one."""

    def __init__(self, base: nn.Embedding, new: NewRows):
        super().__init__()
        self.base, self.new = base, new

    @property
    def weight(self) -> torch.Tensor:
        """(V, C): the frozen rows, then the new ones (for a reader of the whole table)."""
        return self.new(self.base.weight)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        start = self.new.start
        old = F.embedding(idx, self.base.weight.detach())  # (B, T, C); a new id's row here is replaced below
        new = F.embedding((idx - start).clamp(min=0), self.new.rows)  # (B, T, C)
        return torch.where((idx >= start).unsqueeze(-1), new, old)


class NewRowsHead(nn.Module):
    """The output head with trainable new rows (a tied head shares the embedding's NewRows).
    `weight_blocks` is what the training loss reads (model/fused_loss.py): the frozen rows and the
    new ones apart, so only the new block gets a gradient; `weight` is the whole (V, C) for a
    reader of the whole matrix."""

    def __init__(self, base: nn.Linear, new: NewRows):
        super().__init__()
        self.base, self.new = base, new
        self.in_features, self.out_features = base.in_features, base.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.new(self.base.weight)  # (V, C)

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    @property
    def weight_blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base.weight[: self.new.start].detach(), self.new.rows  # (start, C), (V - start, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # one product over the whole matrix: the base's scores to the bit


def parse_targets(text: str | Sequence[str]) -> tuple[str, ...]:
    """`attn.c_attn,mlp.c_fc` (or a sequence) as a tuple of TARGETS, in their order; `all` is every one."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if names == ["all"]:
        return TARGETS
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        raise ValueError(f"unknown LoRA target {unknown[0]!r}" if unknown else "no LoRA target given")
    return tuple(t for t in TARGETS if t in names)


def add_lora(model: nn.Module, rank: int, alpha: float, targets: Sequence[str] = TARGETS,
             new_rows_from: int | None = None) -> nn.Module:
    """Freeze every parameter of `model` (a GPT), wrap each block's target Linears in a LoRALinear,
    and, if `new_rows_from` is given, make the embedding and head rows from that id on trainable
    (`train_new_rows`). In place; returns the model."""
    if rank <= 0:
        raise ValueError(f"the LoRA rank must be a positive whole number, got {rank}")
    model.requires_grad_(False)
    for block in model.transformer.h:
        for target in parse_targets(targets):
            part, name = target.split(".")
            owner = getattr(block, part)
            setattr(owner, name, LoRALinear(getattr(owner, name), rank, alpha))
    if new_rows_from is not None and new_rows_from < model.config.vocab_size:
        train_new_rows(model, new_rows_from)
    return model


def train_new_rows(model: nn.Module, start: int) -> None:
    """Rows `start`.. of the token embedding (and of an untied head) trainable, the rest frozen; a
    tied head reads the same rows (one NewRows serves both)."""
    wte, head = model.transformer.wte, model.lm_head
    rows = NewRows(wte.weight, start)
    tied = head.weight is wte.weight
    model.transformer.wte = NewRowsEmbedding(wte, rows)
    model.lm_head = NewRowsHead(head, rows if tied else NewRows(head.weight, start))


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, (LoRALinear, NewRows)) for m in model.modules())


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors by name (every lora_A, lora_B and new rows): what a LoRA checkpoint holds."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def plain_state(model: nn.Module, merged: bool = True) -> dict[str, torch.Tensor]:
    """The state dict of a plain GPT of the base's shape and names: each adapted W as
    W + (alpha / r) B A (`merged`) or as the base's W alone, the embedding and head with their new
    rows. Unchanged tensors are the model's own (no copy): what a save or a load reads."""
    state = {}
    for name, tensor in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if leaf in ("lora_A", "lora_B") or owner.endswith(".new"):
            continue  # the change itself: in W below, or in the new rows
        parent = model.get_submodule(owner[: -len(".base")]) if owner.endswith(".base") else None
        if isinstance(parent, (NewRowsEmbedding, NewRowsHead)):  # a (V, C) table read whole: old rows, then new
            key = owner[: -len(".base")] + "." + leaf
            state[key] = parent.weight.detach() if leaf == "weight" else tensor
        elif isinstance(parent, LoRALinear):
            key = owner[: -len(".base")] + "." + leaf
            state[key] = tensor + parent.delta().to(tensor.dtype) if merged and leaf == "weight" else tensor
        else:
            state[name] = tensor
    return state


def merge_lora(model: nn.Module) -> nn.Module:
    """A new plain GPT holding `plain_state(model)` (see the module): the same outputs to float
    rounding, with no extra work per token. `model` is left as it is."""
    from scratchlm.model.gpt import gpt_holding

    # copies, so the new model shares no storage; built around them, so it is never initialised first
    plain = gpt_holding(model.config, {k: v.clone() for k, v in plain_state(model).items()})
    return plain.to(next(model.parameters()).device).train(model.training)  # the fixed tables beside the weights


def count_trainable(config, rank: int, targets: Sequence[str] = TARGETS) -> list[tuple[str, int, int, int]]:
    """(target, d_in, d_out, r * (d_in + d_out)) for each target matrix of one block of `config`
    (a GPTConfig): shapes read from a block built on the meta device, so they are the model's own."""
    from scratchlm.model.gpt import Block

    with torch.device("meta"):
        block = Block(config, 0)
    found = []
    for target in parse_targets(targets):
        part, name = target.split(".")
        linear = getattr(getattr(block, part), name)
        found.append((target, linear.in_features, linear.out_features, rank * (linear.in_features + linear.out_features)))
    return found
