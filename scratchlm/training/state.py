"""What a training run advances as it goes: its counters and clocks, in one plain record.

A new run starts from zero; a resumed one from its checkpoint's counters (scratchlm.training.resume).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from scratchlm.errors import UserError


@dataclass
class TrainState:
    """The counters a run advances, the clocks it reads and what it last measured."""

    last_good_ckpt: Path | None = None
    """The newest checkpoint saved after an applied step (a resumed run: the one it came from)."""
    step: int = 0
    """Optimizer steps done, including skipped (non-finite) ones."""
    tokens_seen: int = 0
    bad_in_row: int = 0
    """Skipped steps since the last applied one."""
    bad_total: int = 0
    stopped: bool = False
    """A signal or on_step stopped the run early (a checkpoint was saved)."""

    # --- the clocks, started by begin()
    elapsed_before: float = 0.0
    """Seconds trained before this sitting (a resumed run's earlier ones)."""
    time_share: float = 0.0
    """The part of --time_limit trained so far, by the slowest process's clock (so that every
    process takes the same learning rate and stops at the same step); 0 without a limit."""
    start_step: int = 0
    t_start: float = 0.0
    t_last: float = 0.0
    """When the last log line was written, and tokens_seen then: its tokens/s is of the steps since."""
    tokens_last: int = 0
    step_last: int = 0
    tokens_start: int = 0
    """tokens_seen when this sitting began."""

    # --- what the loop measured
    losses: dict[int, float] = field(default_factory=dict)
    """The training loss of every step of this sitting."""
    interval_losses: list[float] = field(default_factory=list)
    """Finite losses since the last log line, for a smoother curve."""
    val_loss: float | None = None
    val_bpb: float | None = None
    sample: str | None = None

    def begin(self, time_limit: float = 0.0) -> None:
        """Start the clocks: training time counts from here."""
        self.t_start = self.t_last = time.perf_counter()
        self.tokens_last, self.start_step = self.tokens_seen, self.step
        self.step_last, self.tokens_start = self.step, self.tokens_seen
        self.time_share = self.elapsed_before / time_limit if time_limit else 0.0

    def count(self, loss: float, applied: bool, tokens_per_step: int) -> None:
        """One more step done, its update applied or skipped."""
        self.step += 1
        self.tokens_seen += tokens_per_step
        if applied:
            self.bad_in_row = 0
        else:
            self.bad_in_row += 1
            self.bad_total += 1
        self.losses[self.step] = loss
        if math.isfinite(loss):
            self.interval_losses.append(loss)

    def check_bad_steps(self, max_bad_steps: int) -> None:
        """Stop the run, saying where its last good checkpoint is, after too many skipped steps in a row."""
        if self.bad_in_row < max_bad_steps:
            return
        where = (f"the last good checkpoint is {self.last_good_ckpt}" if self.last_good_ckpt
                 else "no checkpoint was saved yet")
        raise UserError(
            f"training stopped at step {self.step}: the loss was not finite for {self.bad_in_row} steps in a "
            f"row; {where}. Lower --lr, use --dtype float32 or check the data"
        )

    def elapsed(self) -> float:
        """Seconds trained, this sitting's and the earlier ones'."""
        return self.elapsed_before + (time.perf_counter() - self.t_start)
