"""Measuring a model during training: the validation loss (on sampled batches, or over the whole
split) and a short sample of text.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from scratchlm.model.gpt import GPT, eval_mode
from scratchlm.text.chat import ChatRow
from scratchlm.training.batches import RankBatches
from scratchlm.training.distributed import all_mean
from scratchlm.training.precision import autocast
from scratchlm.training.sft_batches import IGNORE, padded
from scratchlm.training.setup import RunSetup


@torch.no_grad()
def evaluate(model, setup: RunSetup) -> float:
    """Mean validation loss over eval_iters batches; the same batches every time (a fixed seed),
    drawn from a stream of its own so the training stream and RNGs are untouched."""
    val_tokens, cfg, block_size, device, d = setup.val_tokens, setup.cfg, setup.block_size, setup.device, setup.d
    stream = RankBatches(val_tokens, cfg.batch_size, block_size, cfg.seed + 1, d)
    with eval_mode(model):
        total = torch.zeros((), device=device)
        for _ in range(cfg.eval_iters):
            x, y = stream.next_batch()
            with autocast(device, cfg.dtype):
                _, loss = model(x.to(device), y.to(device), return_logits=not cfg.fused_loss)
            total += loss.float()
    return float(all_mean(total / cfg.eval_iters, d))


@torch.no_grad()
def evaluate_full(model, setup: RunSetup) -> float:
    """Validation loss over the whole split: consecutive windows of block_size + 1 tokens, each
    token after a window's first predicted once; windows shared out over the processes."""
    val_tokens, cfg, block_size, device, d = setup.val_tokens, setup.cfg, setup.block_size, setup.device, setup.d
    T, B = block_size, cfg.batch_size
    n_windows = (len(val_tokens) - 1) // T
    mine = np.arange(d.rank, n_windows, d.world_size)
    with eval_mode(model):
        total = torch.zeros((), device=device, dtype=torch.float64)
        count = torch.zeros((), device=device, dtype=torch.float64)
        per_rank = -(-n_windows // d.world_size)  # the most windows any process gets
        # every process runs the same number of forwards (FSDP gathers weights collectively in each);
        # one that has run out of windows repeats window 0 and leaves it out of the sums
        for i in range(0, per_rank, B):
            starts = mine[i : i + B] * T
            weight = 1.0 if len(starts) else 0.0
            if not len(starts):
                starts = np.zeros(1, dtype=np.int64)
            rows = np.asarray(val_tokens[starts[:, None] + np.arange(T + 1)], dtype=np.int64)  # (b, T+1)
            x = torch.from_numpy(rows[:, :-1].copy()).to(device)  # (b, T)
            y = torch.from_numpy(rows[:, 1:].copy()).to(device)  # (b, T)
            with autocast(device, cfg.dtype):
                _, loss = model(x, y, return_logits=not cfg.fused_loss)
            total += weight * loss.double() * y.numel()
            count += weight * y.numel()
    return _pooled_mean(total, count, d)


@torch.no_grad()
def evaluate_rows(model, setup: RunSetup, rows: Sequence[ChatRow], pad_id: int) -> float:
    """The fine-tuning stage's validation loss: the mean of -log p over every learned target of
    the held-out rows (cut to the context at setup: sft_data), batch_size rows at a time; rows shared out over the
    processes, each running as many forwards as the one with the most (FSDP gathers in each)."""
    cfg, device, d = setup.cfg, setup.device, setup.d
    mine = list(rows)[d.rank :: d.world_size]
    per_rank = -(-len(rows) // d.world_size)
    with eval_mode(model):
        total = torch.zeros((), device=device, dtype=torch.float64)
        count = torch.zeros((), device=device, dtype=torch.float64)
        for i in range(0, per_rank, cfg.batch_size):
            batch, weight = mine[i : i + cfg.batch_size], 1.0
            if not batch:  # this process has run out: it repeats a row and leaves it out of the sums
                batch, weight = list(rows[:1]), 0.0
            x, y = padded(batch, pad_id)
            with autocast(device, cfg.dtype):
                _, loss = model(x.to(device), y.to(device), return_logits=not cfg.fused_loss, ignore_index=IGNORE)
            n = int((y != IGNORE).sum())
            total += weight * loss.double() * n
            count += weight * n
    return _pooled_mean(total, count, d)


def _pooled_mean(total: torch.Tensor, count: torch.Tensor, d) -> float:
    """total / count summed over every process: one mean over all their targets, not a mean of means."""
    if d.enabled:
        import torch.distributed as dist

        both = torch.stack([total, count])
        dist.all_reduce(both)
        total, count = both[0], both[1]
    return float(total / count)


def sample_text(model: GPT, tokenizer, n: int, seed: int) -> str:
    """A short continuation of BOS with scratchlm.generation.generate's sampler (its own seeded generator)."""
    from scratchlm.generation.generate import generate

    with eval_mode(model):
        return generate(model, tokenizer, "", max_new_tokens=n, temperature=0.8, top_k=40, seed=seed).text
