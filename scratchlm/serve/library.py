"""The runs a playground may show, and the models loaded from them.

Every path the server reads comes from here, and none is built from a request: a request names a
run, the name is looked up among the names this module listed itself, and an unknown name is an
error. So `..`, an absolute path, a URL-encoded slash or a symlink leading out of the runs folder
never reaches the file system: none of them is a listed name (and a name that is a path is
refused as one before the lookup). A symlinked run folder is not listed, wherever it points:
one leading outside would serve files from elsewhere, and one leading to a run inside would list
that run twice under two names. The listing reads a run's checkpoint config only where its real
path lies inside the folder; a run whose files cannot be read is listed with its error, never
hiding the others.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchlm.errors import UserError

MODELS_KEPT = 2
"""Loaded models kept in memory at once; the least recently used one is dropped past this."""


class UnknownRun(LookupError):
    """A request named a run that is not in the listing."""


@dataclass(frozen=True)
class RunEntry:
    name: str
    path: Path  # a run folder, or a checkpoint folder given with --checkpoint
    metrics: Path | None  # its metrics.jsonl, where one exists

    @property
    def run_dir(self) -> Path:
        """The folder a training process locks: the run's, also for one of its checkpoints."""
        return self.path.parent if (self.path / "config.json").is_file() else self.path


@dataclass
class Loaded:
    """A model ready to serve (used on the server's model thread only: streams.ModelThread)."""

    name: str
    model: Any
    tokenizer: Any
    info: dict[str, Any]
    labels: Any = None  # labels.Labels: each token's label as a JSON literal, made once
    stamp: tuple = ()  # the checkpoint files' (path, size, mtime) when loaded: _fingerprint
    engine: Any = field(init=False, default=None)  # generation.engine.Engine: the model and tokenizer ready to generate, made once

    def __post_init__(self):
        from scratchlm.generation.engine import Engine
        from scratchlm.serve.labels import Labels

        self.labels = Labels(self.tokenizer)
        self.engine = Engine(self.model, self.tokenizer)


def _is_run(path: Path) -> bool:
    from scratchlm.checkpoint import latest_checkpoint

    return (path / "metrics.jsonl").is_file() or latest_checkpoint(path) is not None


def _metrics_of(path: Path) -> Path | None:
    for folder in (path, path.parent):
        if (folder / "metrics.jsonl").is_file():
            return folder / "metrics.jsonl"
    return None


class RunLibrary:
    """The runs under one folder (`--runs`), or one checkpoint (`--checkpoint`)."""

    def __init__(self, runs: Path | str | None = None, checkpoint: Path | str | None = None, device: str = "cpu"):
        if (runs is None) == (checkpoint is None):
            raise ValueError("give exactly one of runs and checkpoint")
        self.device = device
        self.runs = None if runs is None else Path(runs).resolve()
        self.checkpoint = None if checkpoint is None else Path(checkpoint).resolve()
        if self.runs is not None and not self.runs.is_dir():
            raise UserError(f"--runs {runs}: no such folder")
        if self.checkpoint is not None:
            from scratchlm.checkpoint import resolve_checkpoint

            resolve_checkpoint(self.checkpoint)  # one clear error now rather than on the first request
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self._load_lock = threading.Lock()

    def entries(self) -> list[RunEntry]:
        """The runs, newest first (by their metrics or checkpoint time), read afresh each call."""
        if self.checkpoint is not None:
            return [RunEntry(self.checkpoint.name, self.checkpoint, _metrics_of(self.checkpoint))]
        found = []
        for child in self.runs.iterdir():
            try:
                if child.is_symlink() or not child.is_dir() or child.resolve().parent != self.runs:
                    continue
                if _is_run(child):
                    found.append((-_mtime(child), child.name, child))
            except (OSError, UnicodeDecodeError):  # unreadable: not a run this server can show
                continue
        found.sort()
        return [RunEntry(p.name, p, _metrics_of(p)) for _, _, p in found]

    def entry(self, name: Any) -> RunEntry:
        """The listed run called `name` (an exact match), or UnknownRun."""
        if name is None:
            raise UnknownRun("no run named in the request; GET /api/runs lists them")
        if isinstance(name, str) and (name in (".", "..") or any(c in name for c in "/\\\0")):
            raise UnknownRun(f"run {name[:80]!r} is a path; a run is named by its folder's name alone")
        if isinstance(name, str):
            for e in self.entries():
                if e.name == name:
                    return e
        raise UnknownRun(f"no run named {str(name)[:80]!r}; GET /api/runs lists them")

    def load(self, name: Any) -> Loaded:
        """The model of run `name`, loaded once and kept (see MODELS_KEPT); reloaded when the run
        has written a newer checkpoint since, or its checkpoint's files changed (trained again)."""
        entry = self.entry(name)
        try:
            return self._load(entry)
        except UnicodeDecodeError:  # a `latest` pointer, say, that is not text
            raise UserError(f"run {entry.name}: a file of it that should be text is not") from None

    def _load(self, entry: RunEntry) -> Loaded:
        from scratchlm.checkpoint import WEIGHTS_FILE, latest_checkpoint, load_model, resolve_checkpoint

        is_checkpoint = any((entry.path / f).is_file() for f in ("config.json", WEIGHTS_FILE))
        if not is_checkpoint and latest_checkpoint(entry.path) is None:
            raise UserError(f"run {entry.name}: no checkpoint yet (a run in training writes one every "
                            "checkpoint_interval steps, and at its end)")
        with self._load_lock:
            ckpt = resolve_checkpoint(entry.path)
            files = _files_read(ckpt)
            for path in files:
                self.check_inside(path)
            stamp = _fingerprint(files)  # a run trained again under the same checkpoint name differs here
            kept = self._loaded.get(entry.name)
            if kept is not None and kept.info["checkpoint"] == ckpt and kept.stamp == stamp:
                self._loaded.move_to_end(entry.name)
                return kept
            model, tokenizer, info = load_model(ckpt, device=self.device)
            if tokenizer is None:
                raise UserError(f"run {entry.name}: no tokenizer saved with its checkpoint")
            loaded = Loaded(entry.name, model, tokenizer, info, stamp=stamp)
            self._loaded[entry.name] = loaded
            self._loaded.move_to_end(entry.name)
            while len(self._loaded) > MODELS_KEPT:
                self._loaded.popitem(last=False)
            return loaded

    def check_inside(self, path: Path) -> Path:
        """`path` itself, after checking that its real path lies in the runs folder: a symlink in a
        run (a checkpoint, a tokenizer, a metrics file) pointing elsewhere is refused."""
        root = self.runs if self.runs is not None else self.checkpoint.parent
        if path.exists() and not path.resolve().is_relative_to(root):
            raise UnknownRun(f"{path.name} leads outside the served folder; not served")
        return path

    def describe(self, entry: RunEntry) -> dict[str, Any]:
        """What the model picker shows of a listed run (see `describe`); a run whose checkpoint
        leads outside the served folder, or cannot be read, is shown with an "error" instead."""
        try:
            return describe(entry, self.check_inside)
        except (UnknownRun, UserError, OSError, UnicodeDecodeError) as exc:
            why = "a file of it that should be text is not" if isinstance(exc, UnicodeDecodeError) else str(exc)
            return {"name": entry.name, "checkpoint": None, "step": None, "model": None, "training": False,
                    "error": why.replace(str(entry.path), entry.name)[:200]}

    def metrics(self, entry: RunEntry) -> Path | None:
        """The listed run's metrics file, checked to lie inside the served folder."""
        return None if entry.metrics is None else self.check_inside(entry.metrics)


def _files_read(ckpt: Path) -> list[Path]:
    """Every path load_model may read for checkpoint `ckpt`."""
    paths = [ckpt, *ckpt.iterdir()]
    for folder in (ckpt / "tokenizer", ckpt.parent / "tokenizer"):
        if folder.is_dir():
            paths += [folder, *folder.iterdir()]
    return paths


def _fingerprint(files: list[Path]) -> tuple:
    """What tells one checkpoint's files from others written later at the same paths."""
    stamps = []
    for path in files:
        try:
            st = path.stat()
        except FileNotFoundError:  # a run pruning its old checkpoints (keep_last) just now
            raise UserError(f"{path.parent.name}: the checkpoint went away while loading; try again") from None
        stamps.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(stamps))


def _mtime(path: Path) -> float:
    for name in ("metrics.jsonl", "latest", "config.json"):
        if (path / name).exists():
            return (path / name).stat().st_mtime
    return path.stat().st_mtime


def describe(entry: RunEntry, check=lambda path: path) -> dict[str, Any]:
    """What the model picker shows of a run, read from its files without loading the model;
    `check(path)` is called on the config file first (RunLibrary.check_inside)."""
    from scratchlm.runlock import holder
    from scratchlm.text.tang import TANG_PROMPT, is_tang
    from scratchlm.checkpoint import SavedConfig, latest_checkpoint

    ckpt = entry.path if (entry.path / "config.json").is_file() else latest_checkpoint(entry.path)
    out: dict[str, Any] = {"name": entry.name, "checkpoint": None, "step": None, "model": None,
                           "training": holder(entry.run_dir) is not None}
    if ckpt is not None:
        check(ckpt / "config.json")
        saved = SavedConfig.read(ckpt)
        out.update(checkpoint=ckpt.name, step=saved.step, model=saved.model)
        data = (saved.data or {}).get("data")
        if is_tang(data):
            out["prompt"] = TANG_PROMPT  # the page opens a Tang run with a line to continue
    return out
