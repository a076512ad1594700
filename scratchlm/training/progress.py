"""What a training run tells: a line of JSON per event in the run's metrics.jsonl (for `scratchlm
plot` and anyone else), and lines or a progress bar for the person watching.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from scratchlm.fileio import append_line
from scratchlm.training.train_config import TrainConfig



class Reporter:
    """Log lines or a tqdm bar on the main process; every record also goes to metrics.jsonl."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, is_main: bool, start_step: int):
        self.is_main = is_main
        self.metrics_path = run_dir / "metrics.jsonl"
        mode = cfg.progress
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if is_main else "quiet"
        self.bar = None
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.max_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr)

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

    def progress(self, step: int, loss: float, lr: float, tok_s: float) -> None:
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}", refresh=False)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
