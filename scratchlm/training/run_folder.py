"""A training run's folder: a new one (checked, so nothing a user made is replaced), a resumed
one (its latest checkpoint, and steps left to train), or one a run killed while it started left
behind; locked for one writer (scratchlm.runlock) before anything is written."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import torch

from scratchlm.errors import UserError, check_folder_path
from scratchlm.fileio import ASIDE_PREFIX, STAGED_PREFIX, cut_torn_tail, why_write_failed
from scratchlm.runlock import LOCK_FILE, RunLock, holder, holder_of
from scratchlm import checkpoint as ckpt_io
from scratchlm.training.distributed import Dist, any_rank
from scratchlm.training.train_config import TrainConfig

METRICS_FILE = "metrics.jsonl"
"""The run's log: one JSON record per event (scratchlm.training.progress)."""


def take_run_folder(cfg: TrainConfig, d: Dist, device: torch.device) -> tuple[Path, Path | None, RunLock | None]:
    """The run's folder, locked by the main process (scratchlm.runlock), and, when resuming, the
    checkpoint to resume from (checked): read after the lock is taken, so no other writer can
    move `latest` under us."""
    run_dir = Path(cfg.resume) if cfg.resume else (Path(cfg.out_dir) if cfg.out_dir else _default_run_dir(cfg))
    if cfg.resume and cfg.out_dir and Path(cfg.out_dir).resolve() != run_dir.resolve():
        raise UserError("--resume continues the run in its own directory; drop --out_dir or make them equal")
    if cfg.resume and ckpt_io.latest_checkpoint(run_dir) is None:
        raise UserError(f"{run_dir}: no complete checkpoint to resume from")
    lock, refusal = None, None
    if d.is_main:  # the main process checks and locks; the others learn the outcome, so all stop together
        try:
            if not cfg.resume:
                _check_fresh_run_dir(run_dir)
            lock = RunLock(run_dir).acquire()
            if not cfg.resume:
                _check_fresh_run_dir(run_dir)  # again: another run may have started here before the lock
        except UserError as exc:
            refusal = exc
            if lock is not None:
                lock.release()
    if any_rank(refusal is not None, d, device):
        raise refusal or UserError(f"{run_dir}: the main process could not take the run folder; see its error")
    try:
        if not cfg.resume:
            return run_dir, None, lock
        resume_ckpt = ckpt_io.latest_checkpoint(run_dir)
        saved = ckpt_io.SavedConfig.read(resume_ckpt).train
        saved_optimizer = saved.get("optimizer", "adamw") if saved is not None else cfg.optimizer
        if saved_optimizer != cfg.optimizer:  # the two keep different state: one cannot continue the other
            raise UserError(f"{run_dir} was trained with --optimizer {saved_optimizer}; resume it with the same "
                            "optimizer (or start a new run)")
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return run_dir, resume_ckpt, lock


def _default_run_dir(cfg: TrainConfig) -> Path:
    return Path("runs") / f"{cfg.preset or cfg.model}-{time.strftime('%Y%m%d-%H%M%S')}"


def _check_fresh_run_dir(run_dir: Path) -> None:
    check_folder_path(run_dir, "--out_dir")
    if not run_dir.exists():
        return
    held = holder_of(run_dir)  # what the holder says it does: training, or a `prepare` into this folder
    pid = held.pid if held else None
    if held is not None and held.pid != os.getpid():
        raise UserError(f"{run_dir}: {held}; choose another --out_dir")
    if killed_while_starting(run_dir):
        if pid is None:  # said once, before this process takes the lock (the check runs again after)
            print(f"note: {run_dir}: a run killed while it started left its tokenizer there (no step was saved); "
                  "starting the run again in it", file=sys.stderr)
        return
    if not run_dir.is_dir() or any(p.name != LOCK_FILE for p in run_dir.iterdir()):  # a lock file alone is no run
        if stopped_before_first_checkpoint(run_dir):
            raise UserError(  # --resume would only say there is nothing to resume
                f"{run_dir} already holds files but no checkpoint (a run stopped before its first one?); "
                "delete it to start over there, or choose another --out_dir"
            )
        raise UserError(
            f"{run_dir} already holds files (a run?); pass --resume {run_dir} to continue it, "
            "or choose another --out_dir"
        )


_START_LEFTOVERS = (f"{STAGED_PREFIX}{ckpt_io.TOKENIZER_DIR}-", f"{ASIDE_PREFIX}{ckpt_io.TOKENIZER_DIR}-")
"""How the temporary folders of save_tokenizer begin: what a kill during a run's start can leave."""


def killed_while_starting(run_dir: Path) -> bool:
    """Whether run_dir holds only what a run's start writes before its first step (its lock file,
    the tokenizer and save_tokenizer's temporary folders) and the lock file is a dead process's:
    a run killed there. (A run that ends any other way removes its lock file.)"""
    pid = holder(run_dir) if run_dir.is_dir() else None
    if not run_dir.is_dir() or (pid is not None and pid != os.getpid()):
        return False
    names = {p.name for p in run_dir.iterdir()}
    started = {n for n in names if n in (LOCK_FILE, ckpt_io.TOKENIZER_DIR) or n.startswith(_START_LEFTOVERS)}
    return LOCK_FILE in names and names == started and len(names) > 1


def clear_start_leftovers(run_dir: Path) -> None:
    """Remove what a run killed while starting left in run_dir (its tokenizer is replaced next)."""
    for p in run_dir.iterdir():
        if p.name.startswith(_START_LEFTOVERS) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def stopped_before_first_checkpoint(run_dir: Path) -> bool:
    """A run folder (its metrics.jsonl is written from the first step) that holds no checkpoint."""
    return (run_dir / METRICS_FILE).is_file() and ckpt_io.latest_checkpoint(run_dir) is None


def ready_for_writing(run_dir: Path, tokenizer, resumed: bool) -> None:
    """A new run's folder made, only now (a run that fails to start leaves no folder behind), with
    its tokenizer; a torn last record cut off a resumed run's log before the run appends to it."""
    if resumed:
        cut = cut_torn_tail(run_dir / METRICS_FILE)
        if cut:
            print(f"note: {run_dir / METRICS_FILE}: cut a torn last record ({cut} bytes, from a write that did not "
                  "finish); the records before it are kept", file=sys.stderr)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    save_run_tokenizer(tokenizer, run_dir)


def save_run_tokenizer(tokenizer, run_dir: Path) -> None:
    """Save a new run's tokenizer, staged and renamed (checkpoint.save_tokenizer), so that a kill
    here leaves a folder the same command starts again; a failure (a full disk) names the
    tokenizer folder, not the temporary one, and says that nothing was trained yet."""
    clear_start_leftovers(run_dir)
    try:
        ckpt_io.save_tokenizer(tokenizer, run_dir)
    except OSError as exc:
        raise UserError(f"{run_dir / ckpt_io.TOKENIZER_DIR}: cannot save the run's tokenizer: {why_write_failed(exc)}; "
                        "no step was trained yet, so nothing is lost: free some space (or fix the folder) and run "
                        "the same command again") from None


def kept_and_lost(run_dir: Path, last_good_ckpt: Path | None, step: int) -> str:
    """What a run that stops at `step` keeps (its last good checkpoint) and loses (the steps after it)."""
    if last_good_ckpt is None:
        return (f"Training stopped at step {step} with no checkpoint saved yet, so its steps are lost; free some "
                "space and start the run again")
    at = int(ckpt_io.SavedConfig.read(last_good_ckpt).step or 0)
    if at >= step:
        return f"Training stopped at step {step}; the checkpoint {last_good_ckpt} holds every step"
    return (f"Training stopped at step {step}; kept: {last_good_ckpt} (step {at}); lost: steps {at + 1}-{step}, which "
            f"`scratchlm train --resume {run_dir}` trains again once there is space")


def check_steps_left(run_dir: Path, step: int, max_steps: int, elapsed: float = 0.0, time_limit: float = 0.0) -> None:
    """Refuse a resume with nothing to train: the run is at or past --max_steps (a smaller
    --max_steps than the run reached, or a finished run resumed as it was), or has trained for
    its --time_limit. Exiting 0 there hid the mistake."""
    if step >= max_steps:
        raise UserError(f"{run_dir}: the run is at step {step} and --max_steps is {max_steps}, so there is nothing to "
                        f"train; give a --max_steps above {step} to train it further")
    if time_limit and elapsed >= time_limit:
        raise UserError(f"{run_dir}: the run has trained {elapsed:.1f} s and --time_limit is {time_limit:g}, so there "
                        f"is nothing to train; give a --time_limit above {elapsed:.0f} (or 0 for none) to train it further")
