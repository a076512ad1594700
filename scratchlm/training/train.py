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

`_train` tells the whole run, top to bottom:

    setup    dtype, run folder (locked), tokenizer, block size, data, vocabulary and model config,
             decided once into a frozen RunSetup (scratchlm.training.setup)
    build    the model, and what a step works on (scratchlm.training.parts); a resumed run's
             counters, optimizer state, batch position and RNGs (scratchlm.training.resume)
    loop     learning rate, train_step, count and log; then evaluate, sample and save when due;
             stop early when a signal or on_step asks
    finish   the result and the run's last record
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable

import torch

from scratchlm.machine.flops import device_peak
from scratchlm.model.gpt import GPT
from scratchlm.training import run_folder
from scratchlm.training.distributed import Dist, all_max, all_mean, any_rank, setup_processes
from scratchlm.training.ending import StopRequest, TrainResult, finish
from scratchlm.training.lora_run import base_record
from scratchlm.training.evaluation import evaluate, evaluate_full, evaluate_rows, sample_text
from scratchlm.training.optim import make_optimizer  # noqa: F401 - part of this module's API
from scratchlm.training.parts import TrainParts, build_model, make_parts
from scratchlm.training.precision import autocast
from scratchlm.training.progress import RunLog
from scratchlm.training.resume import changed_settings, restore_run, save_run
from scratchlm.training.resume import resume_config  # noqa: F401 - part of this module's API
from scratchlm.training.setup import RunSetup, set_up_run
from scratchlm.training.state import TrainState
# the config's names are also this module's API (train_config is torch-free, so the CLI parser reads them there)
from scratchlm.training.train_config import (  # noqa: F401
    DTYPES, LR_SCHEDULES, TRAIN_PRESETS, CliField, TrainConfig, cli_fields, config_from_preset,
)


# --------------------------------------------------------------------------------------------
# Learning rate
# --------------------------------------------------------------------------------------------


def learning_rate(step: int, cfg: TrainConfig, time_share: float = 0.0) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then decay to min_lr.
    time_share: the part of cfg.time_limit already trained; the decay goes by it where it is
    further along than the steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    end = cfg.decay_steps or cfg.max_steps
    if step >= end:
        return cfg.min_lr
    progress = max((step - cfg.warmup_steps) / max(1, end - cfg.warmup_steps), time_share)  # 0 -> 1
    if progress >= 1:
        return cfg.min_lr
    if cfg.lr_schedule == "cosine":
        return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)
    return cfg.lr - progress * (cfg.lr - cfg.min_lr)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def train(cfg: TrainConfig, *, on_step: Callable[[int, dict], bool | None] | None = None) -> TrainResult:
    """Train a model as `cfg` says; return where it went and how it did. `cfg` itself is not
    changed (the run records its own copy, with the dtype and folder it chose written in).

    on_step(step, record) is called on the main process after every step; returning True stops
    the run as a signal would (a checkpoint is saved first).
    """
    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    d, device = setup_processes(cfg)
    try:
        # --- setup: every decision once, in order; the run folder is ours (locked) from here
        result = _train(set_up_run(cfg, d, device), on_step)
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


def _train(setup: RunSetup, on_step) -> TrainResult:
    cfg = setup.cfg  # the given config with the decisions written in: what the log and checkpoints record
    log = None
    try:
        # --- the model and what drives it; a resumed run's counters and states
        model = build_model(setup)  # new, the --init_from source's weights, or the checkpoint's
        parts = make_parts(model, setup)  # wrapped for several processes, compiled, optimizer, scaler, batches
        state = restore_run(setup, parts) if setup.resume_ckpt is not None else TrainState()
        # MFU's denominator: a datasheet figure or a bound on the CPU, (FLOP/s, where it comes from);
        # taken before the folder is made, since a bad SCRATCHLM_CPU_MAX_GHZ is an error
        peak = device_peak(setup.device, cfg.dtype) if setup.d.is_main else None
        if setup.d.is_main:
            run_folder.ready_for_writing(setup.run_dir, setup.tokenizer, resumed=setup.resume_ckpt is not None)
            if cfg.lora_rank:  # the adapters' base: written once, recorded in every checkpoint
                setup.lora_base.update(base_record(setup, model))
        log = RunLog(setup, state, peak)
        log.start(model.num_params(), changed_settings(setup))

        # --- the loop
        with StopRequest() as stop:
            state.begin(cfg.time_limit)
            while state.step < cfg.max_steps and state.time_share < 1:
                lr = learning_rate(state.step, cfg, state.time_share)
                for group in parts.optimizer.param_groups:
                    group["lr"] = lr
                drawn = parts.batches.drawn
                loss, norm, applied = train_step(parts, cfg, setup.d, setup.device)
                state.count(loss, applied, parts.batches.drawn - drawn)  # the fine-tuning rows' real length
                if not applied:  # a non-finite loss or gradient: the weights were left as they were
                    log.skipped(loss)
                    state.check_bad_steps(cfg.max_bad_steps)  # too many in a row stop the run
                if cfg.time_limit:
                    state.time_share = all_max(state.elapsed(), setup.d, setup.device) / cfg.time_limit
                last = state.step == cfg.max_steps or state.time_share >= 1
                record = log.step(loss, lr, norm, last)
                evaluating = last or _every(cfg.eval_interval, state.step)
                if evaluating:
                    state.val_loss, state.val_bpb = _evaluate(setup, parts, log, last)
                if (evaluating and cfg.sample_interval == 0) or _every(cfg.sample_interval, state.step):
                    state.sample = _sample(setup, model, log, state.step)
                if (last or _every(cfg.checkpoint_interval, state.step)) and state.bad_in_row == 0:
                    state.last_good_ckpt = save_run(setup, parts, model, state, log)  # only after a good step
                if _stop_requested(stop, on_step, record, setup, state) and not last:
                    state.last_good_ckpt = save_run(setup, parts, model, state, log)
                    state.stopped = True
                    log.stopped(stop.signal_name or "a stop request")
                    break
        return finish(setup, state, log)
    finally:
        if log is not None:
            log.close()
        setup.release()


def train_step(parts: TrainParts, cfg: TrainConfig, d: Dist, device: torch.device) -> tuple[float, float, bool]:
    """One optimizer step over grad_accum micro-batches of parts.batches.

    Returns (loss averaged over micro-batches and processes, gradient norm before clipping,
    whether the update was applied). A non-finite loss or gradient norm skips the update:
    one bad batch must not poison the weights. The learning rate is the optimizer's as set.
    """
    model, optimizer, scaler = parts.model, parts.optimizer, parts.scaler
    loss_sum = torch.zeros((), device=device)
    for micro in range(cfg.grad_accum):
        x, y = parts.batches.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # DDP: only the last micro-batch's backward needs the gradient all-reduce
        last_micro = micro == cfg.grad_accum - 1
        sync = model.no_sync() if (d.enabled and not cfg.fsdp and not last_micro) else nullcontext()
        with sync:
            with autocast(device, cfg.dtype):
                _, loss = parts.forward(x, y, return_logits=not cfg.fused_loss)
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


# --------------------------------------------------------------------------------------------
# What the loop does when it is due
# --------------------------------------------------------------------------------------------


def _every(interval: int, step: int) -> bool:
    """Whether `step` is one of every `interval` steps (0: never)."""
    return bool(interval) and step % interval == 0


def _evaluate(setup: RunSetup, parts: TrainParts, log: RunLog, last: bool) -> tuple[float, float]:
    """(validation loss, bits per byte), recorded and said: on eval_iters batches, or at the last
    step on the whole validation split when it holds at most full_eval_windows windows."""
    cfg = setup.cfg
    if setup.fine_tuning is not None:  # every held-out conversation, every time
        log.evaluating(True)
        val_loss = evaluate_rows(parts.model, setup, setup.fine_tuning.val_rows, setup.tokenizer.eos_id)
        full = True
    else:
        full = last and (len(setup.val_tokens) - 1) // setup.block_size <= cfg.full_eval_windows
        log.evaluating(full)
        val_loss = (evaluate_full if full else evaluate)(parts.model, setup)
    bpb = val_loss / math.log(2) / setup.bytes_per_token
    log.evaluation(val_loss, bpb, full)
    return val_loss, bpb


def _sample(setup: RunSetup, model: GPT, log: RunLog, step: int) -> str | None:
    """A short sample, recorded and said, drawn with RNGs of its own (training's are untouched);
    by the main process only, and not from FSDP's shards."""
    cfg, d, device = setup.cfg, setup.d, setup.device
    if cfg.sample_tokens == 0 or (cfg.fsdp and d.enabled) or not d.is_main:
        return None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        text = sample_text(model, setup.tokenizer, cfg.sample_tokens, cfg.seed + step)
    log.sample(text)
    return text


def _stop_requested(stop: StopRequest, on_step, record: dict, setup: RunSetup, state: TrainState) -> bool:
    """Whether a signal (on any process) or on_step asked to stop; every process
    takes part in the vote at every step."""
    hook_stop = bool(on_step(state.step, record)) if (on_step is not None and setup.d.is_main) else False
    return any_rank(stop.requested or hook_stop, setup.d, setup.device)
