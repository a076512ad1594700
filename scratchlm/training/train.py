"""Training: `train(cfg)` runs the loop from raw text to a saved, evaluated model.

One step (station 16):

    for each of grad_accum micro-batches:  x, y (B, T) -> model -> loss / grad_accum -> backward
    clip the gradient norm to grad_clip, set the learning rate from the schedule, AdamW step,
    zero_grad(set_to_none)

around it: warmup then cosine (or linear) decay, mixed precision (bf16 autocast on CPU/CUDA, fp16
with a gradient scaler on CUDA), optional torch.compile and activation checkpointing, evaluation
(validation loss, perplexity, bits per byte, a short sample), model FLOPs utilisation, atomic
checkpoints with exact resume, skipping of non-finite steps, and multi-process training with
DistributedDataParallel or FSDP2 when launched by torchrun. The same function runs under plain
`python` and under `torchrun`; it reads its settings from `TrainConfig`, never from sys.argv.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable

import torch

from scratchlm.training.distributed import Dist, all_mean, setup_processes
from scratchlm.training.precision import autocast
from scratchlm.training.optim import make_optimizer  # noqa: F401 - part of this module's API
from scratchlm.training.run import Run, StopRequest, TrainResult, resume_config  # noqa: F401 - resume_config: this module's API
from scratchlm.training.train_config import (  # noqa: F401 - the config's names are also this module's API  # re-exported: torch-free, so the CLI parser can read them
    DTYPES, LR_SCHEDULES, TRAIN_PRESETS, CliField, TrainConfig, cli_fields, config_from_preset, field_docs,
)


# --------------------------------------------------------------------------------------------
# Learning rate
# --------------------------------------------------------------------------------------------


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then decay to min_lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    end = cfg.decay_steps or cfg.max_steps
    if step >= end:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, end - cfg.warmup_steps)  # 0 -> 1
    if cfg.lr_schedule == "cosine":
        return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)
    return cfg.lr - progress * (cfg.lr - cfg.min_lr)


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


def train(cfg: TrainConfig, *, on_step: Callable[[int, dict], bool | None] | None = None) -> TrainResult:
    """Train a model as `cfg` says; return where it went and how it did.

    on_step(step, record) is called on the main process after every step; returning True stops
    the run as a signal would (a checkpoint is saved first).
    """
    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    d, device = setup_processes(cfg)
    try:
        result = _train(cfg, d, device, on_step)
        if d.enabled:
            import torch.distributed as dist

            # No process may tear the group down while another still has a collective in flight:
            # gloo then aborts the early one at exit ("terminate called without an active exception").
            dist.barrier()
        return result
    finally:
        if d.enabled:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _train(cfg: TrainConfig, d: Dist, device: torch.device, on_step) -> TrainResult:
    run = Run(cfg, d, device)  # the run's folder, data, model and optimizer; a resumed run's state
    try:
        with StopRequest() as stop:
            run.begin()
            while run.step < cfg.max_steps:
                lr = learning_rate(run.step, cfg)
                for group in run.optimizer.param_groups:
                    group["lr"] = lr
                loss, norm, applied = _train_step(run.forward, run.model, run.optimizer, run.scaler, run.stream,
                                                  cfg, d, device)
                run.count(loss, applied)
                record = run.log(loss, lr, norm)
                run.evaluate_sample_save()
                if run.stop_requested(stop, on_step, record):
                    break
        return run.finish()
    finally:
        run.close()


def _train_step(forward, model, optimizer, scaler, stream, cfg: TrainConfig, d: Dist,
                device: torch.device) -> tuple[float, float, bool]:
    """One optimizer step over grad_accum micro-batches.

    Returns (loss averaged over micro-batches and processes, gradient norm before clipping,
    whether the update was applied). A non-finite loss or gradient norm skips the update:
    one bad batch must not poison the weights.
    """
    loss_sum = torch.zeros((), device=device)
    for micro in range(cfg.grad_accum):
        x, y = stream.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # DDP: only the last micro-batch's backward needs the gradient all-reduce
        last_micro = micro == cfg.grad_accum - 1
        sync = model.no_sync() if (d.enabled and not cfg.fsdp and not last_micro) else nullcontext()
        with sync:
            with autocast(device, cfg.dtype):
                _, loss = forward(x, y, return_logits=not cfg.fused_loss)
            scaler.scale(loss / cfg.grad_accum).backward()
        loss_sum += loss.detach().float()
    loss_avg = all_mean(loss_sum / cfg.grad_accum, d)
    if scaler.is_enabled():
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    if cfg.grad_clip > 0:
        # foreach: the gradients' norms and their rescaling in one call each, not one per parameter
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=not cfg.fsdp or None)
    else:
        norm = torch.zeros((), device=device)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a sharded DTensor
    # under fp16 the scaler itself skips steps with overflowing gradients and lowers its scale
    applied = bool(torch.isfinite(loss_avg)) and (scaler.is_enabled() or bool(torch.isfinite(norm)))
    if applied:
        scaler.step(optimizer)
    if scaler.is_enabled():
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return float(loss_avg), float(norm), applied
