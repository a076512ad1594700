"""A run's checkpoints as the training loop sees them: what a save holds of a run (weights,
optimizer and scaler state, counters, each process's RNGs and batch position: everything an
exact resume needs), a run restored from one, and the config a resume starts from.
scratchlm.checkpoint writes and reads the files.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scratchlm.errors import UserError
from scratchlm.model.gpt import GPT
from scratchlm.model.lora import trainable_state
from scratchlm import checkpoint as ckpt_io
from scratchlm.training import run_folder
from scratchlm.training.distributed import fsdp_load_optimizer, full_states, gather_objects
from scratchlm.training.parts import TrainParts
from scratchlm.training.progress import RunLog
from scratchlm.training.setup import RunSetup
from scratchlm.training.state import TrainState
from scratchlm.training.train_config import TrainConfig


def save_run(setup: RunSetup, parts: TrainParts, model: GPT, state: TrainState, log: RunLog) -> Path | None:
    """A checkpoint of the run at state.step (every process takes part; the main one writes and
    returns its path)."""
    cfg, d = setup.cfg, setup.d
    model_state, optimizer_state = full_states(model, parts.model, parts.optimizer, cfg, d)
    if cfg.lora_rank:  # the adapters only: they go on the run's base (scratchlm.training.lora_run)
        model_state = trainable_state(model)
    ranks = gather_objects({"rng": rng_state(), "data": parts.batches.state_dict()}, d)
    path = None
    if d.is_main:
        trainer_state = {"step": state.step, "tokens_seen": state.tokens_seen, "bad_in_row": state.bad_in_row,
                         "bad_total": state.bad_total, "elapsed_s": state.elapsed(), "ranks": ranks}
        scaler = parts.scaler.state_dict() if parts.scaler.is_enabled() else None
        try:
            path = ckpt_io.save_checkpoint(
                setup.run_dir, state.step, model_state, setup.saved_config(),
                optimizer_state={"optimizer": optimizer_state, "scaler": scaler},
                trainer_state=trainer_state, keep_last=cfg.keep_last or None,
            )
        except UserError as exc:  # a full disk: say what the stop keeps and what it loses
            kept_and_lost = run_folder.kept_and_lost(setup.run_dir, state.last_good_ckpt, state.step)
            raise UserError(f"{exc}. {kept_and_lost}") from None
        log.record("checkpoint", step=state.step, path=str(path))
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()
    return path


def restore_run(setup: RunSetup, parts: TrainParts) -> TrainState:
    """The resumed checkpoint's counters; its optimizer and scaler state, this process's batch
    position and RNGs put back into place. A run with no steps left to train is refused here,
    after the checkpoint was read (a broken one says so first)."""
    optimizer_state, saved = ckpt_io.load_training_state(setup.resume_ckpt)
    if setup.cfg.fsdp and setup.d.enabled:
        fsdp_load_optimizer(parts.model, parts.optimizer, optimizer_state)
    else:
        parts.optimizer.load_state_dict(optimizer_state["optimizer"])
    if optimizer_state.get("scaler"):
        parts.scaler.load_state_dict(optimizer_state["scaler"])
    per_rank = saved["ranks"]
    mine = per_rank[setup.d.rank] if len(per_rank) == setup.d.world_size else per_rank[0]
    parts.batches.load_state_dict(mine["data"])
    set_rng_state(mine["rng"])
    state = TrainState(step=saved["step"], tokens_seen=saved["tokens_seen"], bad_in_row=saved["bad_in_row"],
                       bad_total=saved["bad_total"], elapsed_before=saved.get("elapsed_s", 0.0),
                       last_good_ckpt=setup.resume_ckpt)
    run_folder.check_steps_left(setup.run_dir, state.step, setup.cfg.max_steps, state.elapsed_before,
                                setup.cfg.time_limit)
    return state


def changed_settings(setup: RunSetup) -> dict[str, tuple[Any, Any]]:
    """The training settings a resume changes: {name: (saved value, value now)} (how progress is
    shown, and where the run is, are not training settings). Empty for a new run."""
    if setup.resume_ckpt is None:
        return {}
    then, now = ckpt_io.SavedConfig.read(setup.resume_ckpt).train or {}, setup.cfg.to_dict()
    return {name: (then[name], value) for name, value in now.items()
            if name not in ("resume", "out_dir", "progress") and name in then and then[name] != value}


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    np.random.set_state(_as_tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def resume_config(run_dir: Path | str, **overrides: Any) -> TrainConfig:
    """The training config saved in a run's latest checkpoint, with some fields changed."""
    ckpt = ckpt_io.latest_checkpoint(run_dir)
    if ckpt is None:
        raise UserError(f"{run_dir}: no checkpoint to resume from ({_why_no_checkpoint(Path(run_dir))})")
    saved = ckpt_io.SavedConfig.read(ckpt).train
    if saved is None:
        raise UserError(f"{ckpt / ckpt_io.CONFIG_FILE}: has no training config; it cannot be resumed")
    try:
        TrainConfig.from_dict(saved, complete=True)
    except UserError as exc:
        raise UserError(f"{ckpt / ckpt_io.CONFIG_FILE}: bad training config ({exc})") from None
    model_overrides = {**saved.get("model_overrides", {}), **overrides.pop("model_overrides", {})}
    own = Path(run_dir) / ckpt_io.TOKENIZER_DIR
    if saved.get("tokenizer_file") and not Path(saved["tokenizer_file"]).exists() and own.is_dir():
        saved = {**saved, "tokenizer_file": str(own)}  # e.g. an --init_from source moved away: the run's own copy
    # the saved out_dir is where the run was made; a run folder that was moved or copied resumes where it is now
    return TrainConfig.from_dict({**saved, "out_dir": None, **overrides, "model_overrides": model_overrides,
                                  "resume": str(run_dir)})


def _why_no_checkpoint(run_dir: Path) -> str:
    if not run_dir.exists():
        return "no such folder"
    if run_folder.killed_while_starting(run_dir):
        return ("a run killed while it started, before its first step: start it again with the same command and "
                f"--out_dir {run_dir}")
    if run_folder.stopped_before_first_checkpoint(run_dir):
        return ("a run stopped before its first checkpoint leaves nothing to continue: delete the folder and "
                "start the run again, or start it in another --out_dir")
    return "not a run folder?"
