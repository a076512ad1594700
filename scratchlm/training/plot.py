"""Loss curves of a run: train and validation loss against steps and against tokens seen."""

from __future__ import annotations

import json
from pathlib import Path

from scratchlm.errors import UserError, check_output_file
from scratchlm.fileio import atomic_write
from scratchlm.outdir import check_not_input


def read_metrics(run_dir: Path | str) -> list[dict]:
    """The records of run_dir/metrics.jsonl; a torn last line (a killed run) is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path}: not found; is {run_dir} a run directory made by `scratchlm train`?")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (a bad byte at offset {exc.start}); is it the log `scratchlm train` "
                        "wrote?") from None
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _curve(records: list[dict], event: str, key: str) -> tuple[list[int], list[int], list[float]]:
    """(steps, tokens, values), one point per step; after a resume the later record of a step wins."""
    by_step: dict[int, tuple[int, float]] = {}
    for r in records:
        if r.get("event") == event and isinstance(r.get(key), (int, float)):
            by_step[r["step"]] = (r.get("tokens", 0), float(r[key]))
    steps = sorted(by_step)
    return steps, [by_step[s][0] for s in steps], [by_step[s][1] for s in steps]


def plot_run(run_dir: Path | str, out: Path | str | None = None, force: bool = False) -> Path:
    """Draw the loss curves of a run to a PNG (default run_dir/loss.png); return its path. `out`
    must end in .png (force=True writes any name, replacing what is there)."""
    out = Path(out) if out else Path(run_dir) / "loss.png"
    check_output_file(out, ".png", "--out", force)
    check_not_input(out, [Path(run_dir) / "metrics.jsonl"], "--out")  # --force does not let a picture replace the log
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    # the mean over each logging interval when recorded, else the single step's loss
    train = _curve(records, "train", "loss_mean") if any("loss_mean" in r for r in records) else _curve(records, "train", "loss")
    val = _curve(records, "eval", "val_loss")
    if not train[0] and not val[0]:
        raise UserError(f"{Path(run_dir) / 'metrics.jsonl'}: no loss records to plot yet")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for ax, x_index, label in ((axes[0], 0, "step"), (axes[1], 1, "tokens seen")):
        if train[0]:
            ax.plot(train[x_index], train[2], label="train", lw=1)
        if val[0]:
            ax.plot(val[x_index], val[2], "o-", label="validation", ms=3)
        ax.set_xlabel(label)
        ax.set_ylabel("loss (nats per token)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(str(run_dir))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(out) as f:  # never a half-written picture under the user's name, nor a temp file
            fig.savefig(f, format="png", dpi=110)
    finally:
        plt.close(fig)
    return out
