"""What a training run tells: a line of JSON per event in the run's metrics.jsonl (for `scratchlm
plot` and anyone else), and lines or a progress bar for the person watching. `Reporter` writes
them; `RunLog` words each of a run's events (its start, a step, a skipped update, an evaluation's
start and its result, a sample, a checkpoint, a stop, its end).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from scratchlm.errors import UserError
from scratchlm.fileio import append_line, why_write_failed
from scratchlm.machine.flops import flops_per_token, si_units
from scratchlm.training import run_folder
from scratchlm.training.run_folder import METRICS_FILE
from scratchlm.training.setup import RunSetup
from scratchlm.training.state import TrainState
from scratchlm.training.train_config import TrainConfig


class Reporter:
    """Log lines or a tqdm bar on the main process; every record also goes to metrics.jsonl."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, is_main: bool, start_step: int):
        self.is_main = is_main
        self.metrics_path = run_dir / METRICS_FILE
        mode = cfg.progress
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if is_main else "quiet"
        self.bar = None
        if self.mode == "bar":
            from tqdm import tqdm

            # with a time limit the bar fills with seconds, since the steps it will take are unknown
            total, unit = (cfg.time_limit, "s") if cfg.time_limit else (cfg.max_steps, "step")
            self.bar = tqdm(total=total, initial=0 if cfg.time_limit else start_step, unit=unit, dynamic_ncols=True,
                            file=sys.stderr, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}{postfix}]"
                            if cfg.time_limit else None)

    def record(self, event: str, **values: Any) -> None:
        if not self.is_main:
            return
        line = json.dumps({"event": event, **values, "time": time.time()})
        append_line(self.metrics_path, line)  # whole or not at all: a full disk leaves no half record

    def say(self, text: str) -> None:
        if self.mode == "quiet":
            return
        try:
            if self.bar is not None:
                self.bar.write(text)
            else:
                print(text, flush=True)
        except BrokenPipeError:
            # the reader went away (`scratchlm train ... | head`): keep training and saving, stop
            # printing; stdout now leads nowhere, so later prints cannot fail either
            self.mode = "quiet"
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)

    def progress(self, step: int, loss: float, lr: float, tok_s: float, seconds: float | None = None) -> None:
        """Move the bar to `step`, or with a time limit to `seconds` trained (the step then in its postfix)."""
        if self.bar is not None:
            self.bar.n = min(seconds, self.bar.total) if seconds is not None else step
            steps = {"step": step} if seconds is not None else {}
            self.bar.set_postfix(**steps, loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}", refresh=False)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RunLog(Reporter):
    """A run's Reporter, which words its events. A record that cannot be written to metrics.jsonl
    (a full disk) stops the run with one line naming the log and saying what is kept and what is
    lost; the write itself leaves no half record (scratchlm.fileio.append_line)."""

    def __init__(self, setup: RunSetup, state: TrainState, peak: tuple[float, str] | None) -> None:
        super().__init__(setup.cfg, setup.run_dir, setup.d.is_main, state.step)
        self.setup, self.state = setup, state
        self.peak_source = peak
        """MFU's denominator, (FLOP/s, where the figure comes from); None where none is known."""
        self.peak = peak[0] if peak else None
        self.flops_token = flops_per_token(setup.model_config).training  # the count `scratchlm inspect` prints

    def record(self, event: str, **values: Any) -> None:
        try:
            super().record(event, **values)
        except OSError as exc:
            kept_and_lost = run_folder.kept_and_lost(self.setup.run_dir, self.state.last_good_ckpt, self.state.step)
            raise UserError(f"{self.metrics_path}: cannot append to the run's log: {why_write_failed(exc)}. "
                            f"{kept_and_lost}") from None

    def start(self, params: int, changed: dict[str, tuple[Any, Any]]) -> None:
        """The run's first record and line: what is trained, on what, where; a resume's changed settings."""
        setup, resumed = self.setup, self.setup.resume_ckpt is not None
        if changed:
            self.say("resuming with changed settings: "
                     + ", ".join(f"{name} {old} \u2192 {new}" for name, (old, new) in changed.items()))
        self.record("resume" if resumed else "start", step=self.state.step, config=setup.cfg.to_dict(),
                    **({"changed": changed} if changed else {}),
                    model=setup.model_config.to_dict(), params=params, data_dir=str(setup.data_dir),
                    world_size=setup.d.world_size, device=str(setup.device))
        self.say(
            f"run {setup.run_dir}: {params:,} parameters, {setup.meta['train_tokens']:,} training tokens, "
            + ("up to " if setup.fine_tuning is not None else "") + f"{setup.tokens_per_step:,} tokens/step, "
            f"{si_units(self.flops_token)}FLOP per token (training), "
            f"device {setup.device}" + (f" x{setup.d.world_size}" if setup.d.enabled else "")
            + (f", resuming at step {self.state.step}" if resumed else "")
            + (f", starting from the {setup.source.description}" if setup.source is not None else "")
            + (f"; MFU is of {si_units(self.peak)}FLOP/s: {self.peak_source[1]}" if self.peak_source else "")
        )

    def step(self, loss: float, lr: float, norm: float, last: bool = False) -> dict:
        """The step's record; at a log step (and the last) also its mean loss, tokens/s and MFU, written and said."""
        cfg, state, step = self.setup.cfg, self.state, self.state.step
        now = time.perf_counter()
        record = {"step": step, "loss": loss, "lr": lr, "tokens": state.tokens_seen}
        limit = cfg.time_limit
        seconds = state.time_share * limit if limit else None
        if step == state.start_step + 1 or step % cfg.log_interval == 0 or last:
            # seconds trained so far, earlier sittings included (the end record's elapsed_s is this
            # sitting's); with a time limit, by the clock the limit goes by
            record["trained_s"] = seconds if seconds is not None else state.elapsed()
            dt = now - state.t_last
            tok_s = (state.tokens_seen - state.tokens_last) / dt if dt > 0 else 0.0
            s_step = dt / max(1, step - state.step_last)  # seconds per step since the last line
            state.t_last, state.tokens_last, state.step_last = now, state.tokens_seen, step
            mfu = self.flops_token * tok_s / self.setup.d.world_size / self.peak if self.peak else None  # per device
            mean_loss = sum(state.interval_losses) / len(state.interval_losses) if state.interval_losses else None
            state.interval_losses.clear()
            record.update(loss_mean=mean_loss, tokens_per_s=tok_s, grad_norm=norm, mfu=mfu)
            self.record("train", **record)
            eta = (cfg.max_steps - step) * s_step
            where = f"{step}/{cfg.max_steps}"
            if seconds is not None:  # whichever ends first: the steps or the time
                eta, where = min(eta, max(0.0, limit - seconds)), f"{step} ({seconds:.0f}/{limit:g} s)"
            self.say(f"step {where}: loss {loss:.4f}, lr {lr:.2e}, {tok_s:,.0f} tokens/s"
                     + (f", MFU {100 * mfu:.1f}%" if mfu else "") + f", ETA {eta:.0f}s")
            self.progress(step, loss, lr, tok_s, seconds)
        elif self.bar is not None:
            tok_s = (state.tokens_seen - state.tokens_last) / max(now - state.t_last, 1e-9)
            self.progress(step, loss, lr, tok_s, seconds)
        return record

    def skipped(self, loss: float) -> None:
        """A step whose loss or gradient was not finite: its update was skipped."""
        step, in_a_row = self.state.step, self.state.bad_in_row
        self.record("bad_step", step=step, loss=str(loss), in_a_row=in_a_row)
        self.say(f"step {step}: non-finite loss ({loss}), update skipped ({in_a_row} in a row)")

    def evaluating(self, full: bool) -> None:
        """An evaluation begins (its result, the "eval" record, comes when it is done): so that a
        reader of the log can tell a long evaluation from training."""
        self.record("eval_start", step=self.state.step, full=full)

    def evaluation(self, val_loss: float, bpb: float, full: bool) -> None:
        step, ppl = self.state.step, math.exp(min(val_loss, 50.0))
        self.record("eval", step=step, tokens=self.state.tokens_seen, val_loss=val_loss, val_ppl=ppl, val_bpb=bpb,
                    full=full)
        self.say(f"step {step}: val loss {val_loss:.4f}{' (whole validation split)' if full else ''}, "
                 f"perplexity {ppl:.2f}, bits/byte {bpb:.4f}")

    def sample(self, text: str) -> None:
        self.record("sample", step=self.state.step, text=text)
        self.say(f"--- sample at step {self.state.step} ---\n{text}\n---")

    def stopped(self, why: str) -> None:
        step = self.state.step
        self.record("stopped", step=step, reason=why)
        self.say(f"stopped at step {step} by {why}; saved {self.state.last_good_ckpt}. "
                 f"Continue with: scratchlm train --resume {self.setup.run_dir}")

    def end(self, elapsed: float, tokens_per_s: float) -> None:
        """The run's last record, and its closing line unless it was stopped (which said so)."""
        state, run_dir = self.state, self.setup.run_dir
        self.record("end", step=state.step, elapsed_s=elapsed, tokens_per_s=tokens_per_s, val_loss=state.val_loss,
                    val_bpb=state.val_bpb, bad_steps=state.bad_total, stopped=state.stopped)
        if state.stopped:
            return
        limit = self.setup.cfg.time_limit
        if limit and state.time_share >= 1 and state.step < self.setup.cfg.max_steps:
            self.say(f"--time_limit {limit:g} s reached at step {state.step} of at most {self.setup.cfg.max_steps}")
        self.say(f"done: {state.step} steps in {elapsed:.1f}s ({tokens_per_s:,.0f} tokens/s), "
                 f"val loss {state.val_loss:.4f}; checkpoint in {run_dir}" if state.val_loss is not None
                 else f"done: {state.step} steps; checkpoint in {run_dir}")
