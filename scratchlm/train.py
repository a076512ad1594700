"""Training: `train(cfg)` runs the loop from raw text to a saved, evaluated model.

One step (S17, S18):

    for each of grad_accum micro-batches:  x, y (B, T) -> model -> loss / grad_accum -> backward
    clip the gradient norm to grad_clip, set the learning rate from the schedule, AdamW step,
    zero_grad(set_to_none)

around it: warmup then cosine (or linear) decay, mixed precision (bf16 autocast on CPU/CUDA, fp16
with a gradient scaler on CUDA), optional torch.compile and activation checkpointing, evaluation
(validation loss, perplexity, bits per byte, a short sample), model FLOPs utilisation, atomic
checkpoints with exact resume, skipping of non-finite steps (S19), and multi-process training with
DistributedDataParallel or FSDP2 when launched by torchrun. The same function runs under plain
`python` and under `torchrun`; it reads its settings from `TrainConfig`, never from sys.argv.
"""

from __future__ import annotations

import json
import math
import random
import signal
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from scratchlm import checkpoint as ckpt_io
from scratchlm.config import GPTConfig
from scratchlm.errors import UserError, check_folder_path
from scratchlm.model import GPT
from scratchlm.cpu import auto_dtype
from scratchlm.distributed import (
    Dist, all_mean, any_rank, apply_fsdp, fsdp_load_optimizer, full_states, gather_objects, setup_processes,
)
from scratchlm.evaluation import RankBatches, autocast, evaluate, evaluate_full, sample_text
from scratchlm.flops import device_peak_flops, flops_per_token, si_units
from scratchlm.progress import Reporter
from scratchlm.optim import Muon, MuonWithAdamW, hidden_matrices, newton_schulz_dtype
from scratchlm.train_config import (  # noqa: F401 - the config's names are also this module's API  # re-exported: torch-free, so the CLI parser can read them
    DTYPES, LR_SCHEDULES, TRAIN_PRESETS, CliField, TrainConfig, cli_fields, config_from_preset, field_docs,
)


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    """Optimizer steps done (including skipped non-finite steps)."""
    tokens_seen: int
    losses: dict[int, float]
    """Training loss (averaged over processes) of every step this call ran."""
    val_loss: float | None
    val_bpb: float | None
    elapsed_s: float
    tokens_per_s: float
    bad_steps: int
    stopped: bool = False
    """True when a signal or on_step stopped the run early (a checkpoint was saved)."""
    sample: str | None = None
    is_main: bool = True
    """False on the processes of a multi-process run other than rank 0 (they print nothing)."""


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
# Optimizer
# --------------------------------------------------------------------------------------------


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig,
                   device: torch.device) -> torch.optim.AdamW | MuonWithAdamW:
    """AdamW with decay on matrices (every parameter of 2 or more dimensions) only.

    With cfg.optimizer == "muon": torch.optim.Muon on the blocks' matrices and this AdamW on the
    rest, as one scratchlm.optim.MuonWithAdamW (same lr, schedule and weight decay for both).
    """
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}  # a tied matrix appears once
    muon_params: list[torch.nn.Parameter] = []
    if cfg.optimizer == "muon":
        muon_params = hidden_matrices(model)
        taken = {id(p) for p in muon_params}
        params = {n: p for n, p in params.items() if id(p) not in taken}
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    extra: dict[str, Any] = {}
    if cfg.fsdp:
        extra["foreach"] = True  # sharded (DTensor) parameters: the foreach path supports them everywhere
    elif device.type in ("cuda", "cpu"):
        extra["fused"] = True  # one kernel for all parameters instead of one per tensor
    adamw = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **extra)
    if cfg.optimizer != "muon":
        return adamw
    muon = Muon(muon_params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                nesterov=True, adjust_lr_fn="match_rms_adamw", ns_dtype=newton_schulz_dtype(device))
    return MuonWithAdamW(muon, adamw)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def _data_config(cfg: TrainConfig, block_size: int | None = None):
    from scratchlm.data import DataConfig

    values: dict[str, Any] = dict(data=cfg.data, tokenizer=cfg.tokenizer, val_fraction=cfg.val_fraction,
                                  block_size=block_size)
    if cfg.vocab_size is not None:
        values["vocab_size"] = cfg.vocab_size
    if cfg.tokenizer_file is not None:
        values["tokenizer_file"] = cfg.tokenizer_file
    return DataConfig(**values)


def _prepare_data(cfg: TrainConfig, d: Dist, block_size: int) -> Path:
    """Prepare (or find) the token shards; rank 0 first so processes never race on the cache."""
    from scratchlm.data import ensure_prepared

    data_cfg = _data_config(cfg, block_size)
    cache = Path(cfg.data_cache) if cfg.data_cache else None
    if d.enabled:
        import torch.distributed as dist

        if d.is_main:
            prepared = ensure_prepared(data_cfg, cache)
        dist.barrier()
        if not d.is_main:
            prepared = ensure_prepared(data_cfg, cache)
        return Path(prepared)
    return Path(ensure_prepared(data_cfg, cache))


# --------------------------------------------------------------------------------------------
# Run directory and resume state
# --------------------------------------------------------------------------------------------


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    np.random.set_state(_as_tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def _default_run_dir(cfg: TrainConfig) -> Path:
    return Path("runs") / f"{cfg.preset or cfg.model}-{time.strftime('%Y%m%d-%H%M%S')}"


def _check_fresh_run_dir(run_dir: Path) -> None:
    check_folder_path(run_dir, "--out_dir")
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        if _stopped_before_first_checkpoint(run_dir):
            raise UserError(  # --resume would only say there is nothing to resume
                f"{run_dir} already holds files but no checkpoint (a run stopped before its first one?); "
                "delete it to start over there, or choose another --out_dir"
            )
        raise UserError(
            f"{run_dir} already holds files (a run?); pass --resume {run_dir} to continue it, "
            "or choose another --out_dir"
        )


def _stopped_before_first_checkpoint(run_dir: Path) -> bool:
    """A run folder (its metrics.jsonl is written from the first step) that holds no checkpoint."""
    return (run_dir / "metrics.jsonl").is_file() and ckpt_io.latest_checkpoint(run_dir) is None


def resume_config(run_dir: Path | str, **overrides: Any) -> TrainConfig:
    """The training config saved in a run's latest checkpoint, with some fields changed."""
    ckpt = ckpt_io.latest_checkpoint(run_dir)
    if ckpt is None:
        if not Path(run_dir).exists():
            why = "no such folder"
        elif _stopped_before_first_checkpoint(Path(run_dir)):
            why = ("a run stopped before its first checkpoint leaves nothing to continue: delete the folder and "
                   "start the run again, or start it in another --out_dir")
        else:
            why = "not a run folder?"
        raise UserError(f"{run_dir}: no checkpoint to resume from ({why})")
    saved = ckpt_io.read_config(ckpt).get("train")
    if not isinstance(saved, dict):
        raise UserError(f"{ckpt / ckpt_io.CONFIG_FILE}: has no training config; it cannot be resumed")
    model_overrides = {**saved.get("model_overrides", {}), **overrides.pop("model_overrides", {})}
    # the saved out_dir is where the run was made; a run folder that was moved or copied resumes where it is now
    return TrainConfig.from_dict({**saved, "out_dir": None, **overrides, "model_overrides": model_overrides,
                                  "resume": str(run_dir)})


class _StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to stop after the current step (and save);
    a second Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_StopRequest":
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


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
    from scratchlm.data import read_shard
    from scratchlm.tokenizer import load_tokenizer

    if cfg.dtype == "auto":  # what this device multiplies natively; the run's config records the choice
        cfg.dtype = auto_dtype(device)
    if cfg.dtype == "float16" and device.type != "cuda":
        raise UserError("--dtype float16 needs a CUDA device (gradient scaling); use bfloat16 on CPU")

    # --- run directory ---
    resume_ckpt = None
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if cfg.out_dir and Path(cfg.out_dir).resolve() != run_dir.resolve():
            raise UserError("--resume continues the run in its own directory; drop --out_dir or make them equal")
        resume_ckpt = ckpt_io.latest_checkpoint(run_dir)
        if resume_ckpt is None:
            raise UserError(f"{run_dir}: no complete checkpoint to resume from")
        saved = ckpt_io.read_config(resume_ckpt).get("train")
        saved_optimizer = saved.get("optimizer", "adamw") if isinstance(saved, dict) else cfg.optimizer
        if saved_optimizer != cfg.optimizer:  # the two keep different state: one cannot continue the other
            raise UserError(f"{run_dir} was trained with --optimizer {saved_optimizer}; resume it with the same "
                            "optimizer (or start a new run)")
    else:
        run_dir = Path(cfg.out_dir) if cfg.out_dir else _default_run_dir(cfg)
        _check_fresh_run_dir(run_dir)  # every rank checks, so all of them stop together
    cfg.out_dir = str(run_dir)

    # --- data and tokenizer ---
    if resume_ckpt is not None:
        block_size = int(ckpt_io.read_config(resume_ckpt)["model"]["block_size"])
    else:
        block_size = GPTConfig.from_name(cfg.model, **cfg.model_overrides).block_size
    prepared = _prepare_data(cfg, d, block_size)
    meta = json.loads((prepared / "meta.json").read_text(encoding="utf-8"))
    tokenizer = load_tokenizer(prepared / "tokenizer")
    train_tokens = read_shard(prepared / "train.bin")
    val_tokens = read_shard(prepared / "val.bin")
    bytes_per_token = meta["val_bytes"] / max(1, meta["val_tokens"])

    # --- model ---
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    vocab = tokenizer.vocab_size
    if cfg.pad_vocab_multiple > 1:
        vocab = -(-vocab // cfg.pad_vocab_multiple) * cfg.pad_vocab_multiple
    if resume_ckpt is not None:
        model, _, info = ckpt_io.load_model(resume_ckpt, device="cpu")
        model_config = info["model_config"]
        if model_config.vocab_size < tokenizer.vocab_size:
            raise UserError(f"{resume_ckpt}: the model's vocabulary is smaller than the data's tokenizer")
    else:
        model_config = cfg.model_config(vocab)
        model = GPT(model_config)
    if d.rank:  # other ranks draw their own dropout masks; rank 0 matches a 1-process run
        torch.manual_seed(cfg.seed + d.rank)
    model.to(device).train()
    model.gradient_checkpointing = cfg.activation_checkpointing
    raw_model = model
    if cfg.fsdp and d.enabled:
        model = apply_fsdp(model, device, d)
    elif d.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    forward = torch.compile(model) if cfg.compile else model
    optimizer = make_optimizer(model, cfg, device)
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.dtype == "float16")
    stream = RankBatches(train_tokens, cfg.batch_size, block_size, cfg.seed, d)

    step, tokens_seen, bad_in_row, bad_total, elapsed_before = 0, 0, 0, 0, 0.0
    last_good_ckpt = resume_ckpt
    if resume_ckpt is not None:
        optimizer_state, state = ckpt_io.load_training_state(resume_ckpt)
        if cfg.fsdp and d.enabled:
            fsdp_load_optimizer(model, optimizer, optimizer_state)
        else:
            optimizer.load_state_dict(optimizer_state["optimizer"])
        if optimizer_state.get("scaler"):
            scaler.load_state_dict(optimizer_state["scaler"])
        step, tokens_seen = state["step"], state["tokens_seen"]
        bad_in_row, bad_total = state["bad_in_row"], state["bad_total"]
        elapsed_before = state.get("elapsed_s", 0.0)
        per_rank = state["ranks"]
        mine = per_rank[d.rank] if len(per_rank) == d.world_size else per_rank[0]
        stream.load_state_dict(mine["data"])
        _set_rng_state(mine["rng"])

    if d.is_main and resume_ckpt is None:
        run_dir.mkdir(parents=True, exist_ok=True)  # only now: a run that fails to start leaves no folder behind
        ckpt_io.save_tokenizer(tokenizer, run_dir)
    reporter = Reporter(cfg, run_dir, d.is_main, step)
    tokens_per_step = cfg.batch_size * block_size * cfg.grad_accum * d.world_size
    peak = device_peak_flops(device, cfg.dtype) if d.is_main else None
    flops_token = flops_per_token(model_config).training  # the count `scratchlm inspect` prints
    flops_step = flops_token * tokens_per_step / d.world_size  # per device
    reporter.record("start" if resume_ckpt is None else "resume", step=step, config=cfg.to_dict(),
                    model=model_config.to_dict(), params=raw_model.num_params(), data_dir=str(prepared),
                    world_size=d.world_size, device=str(device))
    reporter.say(
        f"run {run_dir}: {raw_model.num_params():,} parameters, {meta['train_tokens']:,} training tokens, "
        f"{tokens_per_step:,} tokens/step, {si_units(flops_token)}FLOP per token (training), device {device}"
        + (f" x{d.world_size}" if d.enabled else "")
        + (f", resuming at step {step}" if resume_ckpt is not None else "")
    )

    def save(at_step: int) -> Path | None:
        model_state, optimizer_state = full_states(raw_model, model, optimizer, cfg, d)
        ranks = gather_objects({"rng": _rng_state(), "data": stream.state_dict()}, d)
        path = None
        if d.is_main:
            trainer_state = {"step": at_step, "tokens_seen": tokens_seen, "bad_in_row": bad_in_row,
                             "bad_total": bad_total, "elapsed_s": elapsed_before + (time.perf_counter() - t_start),
                             "ranks": ranks}
            config = {"model": model_config.to_dict(), "train": cfg.to_dict(),
                      "data": _jsonable(asdict(_data_config(cfg))), "tokenizer": {
                          "kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                          "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id}}
            path = ckpt_io.save_checkpoint(
                run_dir, at_step, model_state, config,
                optimizer_state={"optimizer": optimizer_state, "scaler": scaler.state_dict() if scaler.is_enabled() else None},
                trainer_state=trainer_state, keep_last=cfg.keep_last or None,
            )
            reporter.record("checkpoint", step=at_step, path=str(path))
        if d.enabled:
            import torch.distributed as dist

            dist.barrier()
        return path

    def run_eval(at_step: int, full: bool = False) -> tuple[float, float]:
        if full:
            val_loss = evaluate_full(model, val_tokens, cfg, block_size, device, d)
        else:
            val_loss = evaluate(model, val_tokens, cfg, block_size, device, d)
        bpb = val_loss / math.log(2) / bytes_per_token
        reporter.record("eval", step=at_step, tokens=tokens_seen, val_loss=val_loss,
                        val_ppl=math.exp(min(val_loss, 50.0)), val_bpb=bpb, full=full)
        reporter.say(f"step {at_step}: val loss {val_loss:.4f}{' (whole validation split)' if full else ''}, "
                     f"perplexity {math.exp(min(val_loss, 50.0)):.2f}, bits/byte {bpb:.4f}")
        return val_loss, bpb

    def run_sample(at_step: int) -> str | None:
        if cfg.sample_tokens == 0 or (cfg.fsdp and d.enabled) or not d.is_main:
            return None
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            text = sample_text(raw_model, tokenizer, cfg.sample_tokens, cfg.seed + at_step)
        reporter.record("sample", step=at_step, text=text)
        reporter.say(f"--- sample at step {at_step} ---\n{text}\n---")
        return text

    losses: dict[int, float] = {}
    val_loss = bpb = None
    sample = None
    stopped = False
    t_start = time.perf_counter()
    t_last, tokens_last = t_start, tokens_seen
    start_step = step
    interval_losses: list[float] = []  # finite losses since the last log line, for a smoother curve
    try:
        with _StopRequest() as stop:
            while step < cfg.max_steps:
                lr = learning_rate(step, cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                loss_value, norm, applied = _train_step(forward, model, optimizer, scaler, stream, cfg, d, device)
                step += 1
                tokens_seen += tokens_per_step
                if applied:
                    bad_in_row = 0
                else:
                    bad_in_row += 1
                    bad_total += 1
                    reporter.record("bad_step", step=step, loss=str(loss_value), in_a_row=bad_in_row)
                    reporter.say(f"step {step}: non-finite loss ({loss_value}), update skipped ({bad_in_row} in a row)")
                losses[step] = loss_value
                if math.isfinite(loss_value):
                    interval_losses.append(loss_value)
                if bad_in_row >= cfg.max_bad_steps:
                    where = f"the last good checkpoint is {last_good_ckpt}" if last_good_ckpt else "no checkpoint was saved yet"
                    raise UserError(
                        f"training stopped at step {step}: the loss was not finite for {bad_in_row} steps in a row; "
                        f"{where}. Lower --lr, use --dtype float32 or check the data"
                    )

                now = time.perf_counter()
                record = {"step": step, "loss": loss_value, "lr": lr, "tokens": tokens_seen}
                if step == start_step + 1 or step % cfg.log_interval == 0 or step == cfg.max_steps:
                    dt = now - t_last
                    tok_s = (tokens_seen - tokens_last) / dt if dt > 0 else 0.0
                    t_last, tokens_last = now, tokens_seen
                    mfu = (flops_step * tok_s / tokens_per_step) / peak if peak else None
                    mean_loss = sum(interval_losses) / len(interval_losses) if interval_losses else None
                    interval_losses.clear()
                    record.update(loss_mean=mean_loss, tokens_per_s=tok_s, grad_norm=norm, mfu=mfu)
                    reporter.record("train", **record)
                    eta = (cfg.max_steps - step) * tokens_per_step / tok_s if tok_s else 0.0
                    reporter.say(f"step {step}/{cfg.max_steps}: loss {loss_value:.4f}, lr {lr:.2e}, "
                                 f"{tok_s:,.0f} tokens/s" + (f", MFU {100 * mfu:.1f}%" if mfu else "")
                                 + f", ETA {eta:.0f}s")
                    reporter.progress(step, loss_value, lr, tok_s)
                elif reporter.bar is not None:
                    reporter.progress(step, loss_value, lr, (tokens_seen - tokens_last) / max(now - t_last, 1e-9))

                last = step == cfg.max_steps
                if (cfg.eval_interval and step % cfg.eval_interval == 0) or last:
                    full = last and (len(val_tokens) - 1) // block_size <= cfg.full_eval_windows
                    val_loss, bpb = run_eval(step, full=full)
                    if cfg.sample_interval == 0:
                        sample = run_sample(step)
                if cfg.sample_interval and step % cfg.sample_interval == 0:
                    sample = run_sample(step)
                if (cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0) or last:
                    if bad_in_row == 0:
                        last_good_ckpt = save(step)

                hook_stop = bool(on_step(step, record)) if (on_step is not None and d.is_main) else False
                if any_rank(stop.requested or hook_stop, d, device) and not last:
                    why = stop.signal_name or "a stop request"
                    last_good_ckpt = save(step)
                    reporter.record("stopped", step=step, reason=why)
                    reporter.say(f"stopped at step {step} by {why}; saved {last_good_ckpt}. "
                                 f"Continue with: scratchlm train --resume {run_dir}")
                    stopped = True
                    break
    finally:
        reporter.close()

    elapsed = time.perf_counter() - t_start
    done_tokens = (step - start_step) * tokens_per_step
    result = TrainResult(
        run_dir=run_dir, step=step, tokens_seen=tokens_seen, losses=losses, val_loss=val_loss, val_bpb=bpb,
        elapsed_s=elapsed, tokens_per_s=done_tokens / elapsed if elapsed > 0 else 0.0, bad_steps=bad_total,
        stopped=stopped, sample=sample, is_main=d.is_main,
    )
    reporter.record("end", step=step, elapsed_s=elapsed, tokens_per_s=result.tokens_per_s, val_loss=val_loss,
                    val_bpb=bpb, bad_steps=bad_total, stopped=stopped)
    if not stopped:
        reporter.say(f"done: {step} steps in {elapsed:.1f}s ({result.tokens_per_s:,.0f} tokens/s), "
                     f"val loss {val_loss:.4f}; checkpoint in {run_dir}" if val_loss is not None else
                     f"done: {step} steps; checkpoint in {run_dir}")
    return result


def _train_step(forward, model, optimizer, scaler, stream, cfg: TrainConfig, d: Dist,
                device: torch.device) -> tuple[float, float, bool]:
    """One optimizer step over grad_accum micro-batches.

    Returns (loss averaged over micro-batches and processes, gradient norm before clipping,
    whether the update was applied). A non-finite loss or gradient norm skips the update (S19):
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
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
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


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
