"""How a training run ends: early, when a signal or on_step asks it to stop (`StopRequest`), or
at max_steps; and what train() returns (`TrainResult`).
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchlm.training.progress import RunLog
from scratchlm.training.setup import RunSetup
from scratchlm.training.state import TrainState


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


def finish(setup: RunSetup, state: TrainState, log: RunLog) -> TrainResult:
    """The run's result, its last record and closing line."""
    elapsed = time.perf_counter() - state.t_start
    done_tokens = state.tokens_seen - state.tokens_start
    result = TrainResult(
        run_dir=setup.run_dir, step=state.step, tokens_seen=state.tokens_seen, losses=state.losses,
        val_loss=state.val_loss, val_bpb=state.val_bpb, elapsed_s=elapsed,
        tokens_per_s=done_tokens / elapsed if elapsed > 0 else 0.0, bad_steps=state.bad_total,
        stopped=state.stopped, sample=state.sample, is_main=setup.d.is_main,
    )
    log.end(elapsed, result.tokens_per_s)
    return result


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to stop after the current step (and save);
    a second Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
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
