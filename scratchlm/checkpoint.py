"""Checkpoints that survive a crash or a kill at any instant, and that never execute code on load.

Layout of a run directory:

    run_dir/
      ckpt-00000500/          one directory per save, complete or absent, never half-written
        model.safetensors     weights only (a tied lm_head.weight is stored once, as wte)
        config.json           the run's settings and step (SavedConfig: the one type that writes and reads it)
        optimizer.pt          optimizer (and grad scaler) state, read with torch.load(weights_only=True)
        trainer_state.pt      step, tokens seen, RNG states, data stream position (same loader)
      latest                  text file naming the newest complete checkpoint directory
      tokenizer/              the tokenizer, saved once per run with tokenizer.save
      metrics.jsonl           one JSON object per logged event

How a save stays safe: everything is written into a hidden temporary directory next to its final
place, every file and the directory itself are fsynced, the directory is renamed into place (a
rename within one file system is atomic), and only then is `latest` replaced, itself through a
temporary file and `os.replace`. A kill before the rename leaves a stray `.tmp-*` directory that
the next save removes; a kill after it leaves a complete checkpoint that `latest` may not name
yet. Either way `latest` names a complete checkpoint. Old checkpoints are pruned (`keep_last`)
only after the new one is in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from scratchlm.errors import UserError, check_folder_path, read_failure
from scratchlm.fileio import ASIDE_PREFIX, STAGED_PREFIX, atomic_write, staged_name, why_write_failed
from scratchlm.machine.memory import check_model_fits
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT, gpt_holding

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
OPTIMIZER_FILE = "optimizer.pt"
TRAINER_STATE_FILE = "trainer_state.pt"
LATEST_FILE = "latest"
TOKENIZER_DIR = "tokenizer"
LORA_BASE_DIR = "base"
"""A LoRA run's one copy of the model its adapters go on (scratchlm.training.lora_run)."""
_CKPT_RE = re.compile(r"^ckpt-(\d{8,})$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}"


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedConfig:
    """A checkpoint's config.json, the one place its format is written and read back:

        {"model": GPTConfig's fields, "train": TrainConfig's, "data": DataConfig's,
         "data_sources": [{"path", "bytes", "sha256"} of each source file],
         "tokenizer": {"kind", "vocab_size", "bos_id", "eos_id"}, "step": optimizer steps done}

    A training checkpoint holds every section. A weights-only one (save_model_checkpoint, as
    import-hf writes) holds "model", "tokenizer" (kind and size) and what its writer adds
    (`extra`, e.g. "imported_from"), and no step. A section a checkpoint lacks (an older one, a
    weights-only one) reads back as None; the keys are written in the order above, extras after
    "model", so a checkpoint written again is byte for byte what it was.
    """

    model: dict[str, Any]
    train: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    data_sources: list[dict[str, Any]] | None = None
    tokenizer: dict[str, Any] | None = None
    step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """config.json's object: the sections that are set, in the order of the format."""
        values = {"model": self.model, **self.extra}
        for name in _KINDS:
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        return values

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=2).encode("utf-8")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SavedConfig":
        """The sections of a parsed config.json (`read` has checked each one's type)."""
        sections = {name: values[name] for name in _KINDS if values.get(name) is not None}
        extra = {k: v for k, v in values.items() if k != "model" and k not in _KINDS}
        return cls(values["model"], **sections, extra=extra)

    @classmethod
    def read(cls, ckpt_dir: Path | str) -> "SavedConfig":
        """The config.json of the checkpoint in ckpt_dir; a missing, damaged or foreign one is one
        line naming the file."""
        path = Path(ckpt_dir) / CONFIG_FILE
        if not path.is_file():
            raise UserError(f"{path}: missing; the checkpoint is incomplete")
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not valid JSON ({exc}); the file is damaged or truncated") from exc
        if is_hf_config(config):
            raise UserError(f"{path.parent}: this is a Hugging Face model folder, not a scratchlm checkpoint; "
                            f"convert it first: scratchlm import-hf {path.parent} OUT_CKPT")
        if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
            raise UserError(f"{path}: has no 'model' section with the model configuration")
        for name, kind in _KINDS.items():
            value = config.get(name)
            if value is not None and not (isinstance(value, kind) and not isinstance(value, bool)):
                raise UserError(f"{path}: its {name!r} section is {_json_kind(value)} where {_json_kind(kind())} "
                                f"belongs; the file is damaged")
        return cls.from_dict(config)

    def model_config(self, ckpt_dir: Path | str) -> GPTConfig:
        """The model section as a GPTConfig; every field must be there (a default could split the
        same weights another way)."""
        try:
            return GPTConfig.from_dict(self.model, complete=True)
        except UserError as exc:
            raise UserError(f"{Path(ckpt_dir) / CONFIG_FILE}: bad model config ({exc})") from exc


# the sections after "model", in the order they are written, and what each must be
_KINDS = {"train": dict, "data": dict, "data_sources": list, "tokenizer": dict, "step": int}


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words."""
    if isinstance(value, bool):
        return "true or false"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), "null")


# --------------------------------------------------------------------------------------------
# Durable file writing
# --------------------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk, so a power cut keeps it."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_text_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers see the old content or the new, never a mix."""
    with atomic_write(path, durable=True) as f:
        f.write(text.encode("utf-8"))
    _fsync_path(path.parent)


def _torch_save_durably(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _write_failed(target: Path, exc: BaseException) -> UserError:
    """The one-line error for a save that could not be written (the old checkpoints are untouched)."""
    return UserError(f"{target}: cannot save the checkpoint: {why_write_failed(exc)}; nothing was replaced and the "
                     f"previous checkpoints are intact. Free some space (or fix the folder) and resume")


def output_write_failed(target: Path, what: str, exc: BaseException) -> UserError:
    """The one-line error for a new output folder that could not be written (nothing is left of it)."""
    return UserError(f"{target}: cannot write {what}: {why_write_failed(exc)}; nothing of it was left behind. "
                     "Free some space (or fix the folder) and run the command again")


def _new_tmp_dir(parent: Path, name: str) -> Path:
    tmp = parent / staged_name(name)  # short: a 250-character name is legal
    tmp.mkdir(parents=True)
    return tmp


def _remove_stale_tmp_dirs(parent: Path) -> None:
    """Leftovers of saves that were killed before their rename; never referenced by `latest`."""
    for stale in parent.glob(STAGED_PREFIX + "*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def _weights_to_save(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """The tensors to write: contiguous CPU copies, the tied lm_head.weight left out.

    safetensors refuses two names for one storage; with tying, lm_head.weight is wte.weight.
    """
    out = {}
    for name, tensor in state.items():
        if tied and name == "lm_head.weight":
            continue
        out[name] = tensor.detach().to("cpu").contiguous()
    return out


def _write_weights(state: dict[str, torch.Tensor], model_config: GPTConfig, path: Path) -> None:
    save_file(_weights_to_save(state, model_config.tie_weights), str(path), metadata={"format": "pt"})
    _fsync_path(path)


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"{path}: missing weights file; the checkpoint is incomplete, pick another one")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the weights ({exc}); the file is damaged or truncated") from exc


def _model_from_weights(model_config: GPTConfig, weights: dict[str, torch.Tensor], path: Path) -> GPT:
    """A GPT holding `weights`, every name and shape checked against the config first (on a
    model of the meta device: a mismatch costs no memory)."""
    with torch.device("meta"):
        model = GPT(model_config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if model_config.tie_weights:
        expected.pop("lm_head.weight", None)
        weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise UserError(f"{path}: the weights do not match the model config in config.json ({what})")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != tuple(shape):
            raise UserError(
                f"{path}: tensor {name} has shape {tuple(weights[name].shape)} but the model config in "
                f"config.json needs {tuple(shape)}"
            )
    return gpt_holding(model_config, weights)


# --------------------------------------------------------------------------------------------
# Trainer state: RNG states and data positions made loadable with weights_only=True
# --------------------------------------------------------------------------------------------


def to_safe(obj: Any) -> Any:
    """Turn NumPy arrays and scalars (which weights_only loading refuses) into tagged plain data."""
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: to_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_safe(v) for v in obj)
    return obj


def from_safe(obj: Any) -> Any:
    """Inverse of `to_safe`."""
    if isinstance(obj, dict):
        if set(obj) == {"__ndarray__", "dtype"}:
            return np.array(obj["__ndarray__"], dtype=obj["dtype"])
        return {k: from_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_safe(v) for v in obj)
    return obj


def quiet_torch_load(path: Path | str) -> Any:
    """torch.load(weights_only=True) without the warnings it prints on the way to a refusal (a
    pickle protocol it did not write, ...): the caller turns a refusal into one line."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=True)


def _torch_load_safely(path: Path) -> Any:
    if not path.is_file():
        raise UserError(f"{path}: missing; the checkpoint is incomplete or weights-only")
    try:
        return quiet_torch_load(path)
    except Exception as exc:  # a truncated zip or a forbidden pickle global; both mean "bad file"
        raise UserError(f"{path}: cannot read it ({read_failure(exc)})") from exc


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------


def _swap_dir_into_place(tmp: Path, final: Path) -> None:
    """Rename the complete directory `tmp` to `final`, moving an existing `final` aside first
    (a directory cannot be renamed over a non-empty one) and deleting it only afterwards."""
    old = None
    if final.exists():
        old = final.parent / staged_name(final.name, ASIDE_PREFIX)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def rename_into_new(tmp: Path, final: Path) -> None:
    """Rename the folder `tmp` to `final`, which must not exist or be empty: a folder with
    something in it is never replaced, so of two writers of one new folder the second is refused
    here (one line), and the first one's output stays whole."""
    try:
        if final.is_dir():
            final.rmdir()  # only when empty; a rename cannot replace even an empty folder on every platform
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise UserError(f"{final}: another process wrote this folder while this one was writing it; what it "
                        "wrote was left whole, and nothing of this command's was kept. Choose a new folder") from None
    _fsync_path(final.parent)


@contextlib.contextmanager
def staged_dir(final: Path, replace: bool = True) -> Iterator[Path]:
    """A new temporary folder beside `final`: what the block writes there replaces `final` in one
    swap (made durable first) when the block ends without an exception, and is removed otherwise.
    replace=False: `final` must be new or empty when the block ends (see rename_into_new)."""
    tmp = _new_tmp_dir(final.parent, final.name)
    try:
        yield tmp
        _fsync_path(tmp)
        if replace:
            _swap_dir_into_place(tmp, final)
        else:
            rename_into_new(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def save_tokenizer(tokenizer: Any, directory: Path | str) -> Path:
    """Save `tokenizer` to directory/tokenizer/ atomically (temp dir, then rename)."""
    directory = Path(directory)
    final = directory / TOKENIZER_DIR
    with staged_dir(final) as tmp:
        tokenizer.save(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                _fsync_path(f)
    return final


def save_checkpoint(
    run_dir: Path | str,
    step: int,
    model_state: dict[str, torch.Tensor],
    config: SavedConfig,
    *,
    optimizer_state: dict | None = None,
    trainer_state: dict | None = None,
    keep_last: int | None = None,
) -> Path:
    """Write run_dir/ckpt-<step>/ completely, then point run_dir/latest at it; return its path.

    model_state: the model's (unwrapped, full) state dict. config: what config.json says (its step is
    set to `step`). keep_last: after the new checkpoint is in place,
    delete all but the newest K checkpoints (None or 0 keeps all).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model_config = GPTConfig.from_dict(config.model)
    name = checkpoint_name(step)
    final = run_dir / name
    if final.is_dir() and latest_checkpoint(run_dir) == final:
        return final  # this exact step is already saved and named by `latest` (e.g. a stop right after a save)
    _remove_stale_tmp_dirs(run_dir)

    tmp = _new_tmp_dir(run_dir, name)
    try:
        _write_weights(model_state, model_config, tmp / WEIGHTS_FILE)
        _write_bytes_durably(tmp / CONFIG_FILE, dataclasses.replace(config, step=step).to_json())
        if optimizer_state is not None:
            _torch_save_durably(optimizer_state, tmp / OPTIMIZER_FILE)
        if trainer_state is not None:
            _torch_save_durably(to_safe(trainer_state), tmp / TRAINER_STATE_FILE)
        _fsync_path(tmp)
        if final.exists():  # a checkpoint of this step that `latest` does not name: stale, replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_path(run_dir)
        _write_text_atomically(run_dir / LATEST_FILE, name + "\n")
    except (OSError, SafetensorError) as exc:
        raise _write_failed(final, exc) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

    if keep_last:
        prune_checkpoints(run_dir, keep_last)
    return final


def prune_checkpoints(run_dir: Path | str, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints (never the one `latest` names)."""
    run_dir = Path(run_dir)
    keep = {latest_checkpoint(run_dir)}
    ckpts = list_checkpoints(run_dir)
    keep.update(ckpts[-keep_last:])
    removed = []
    for ckpt in ckpts:
        if ckpt not in keep:
            shutil.rmtree(ckpt, ignore_errors=True)
            removed.append(ckpt)
    return removed


def save_model_checkpoint(
    model: GPT,
    tokenizer: Any,
    out_dir: Path | str,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Write a weights-only checkpoint directory that `load_model` reads (used by imports).

    out_dir/ gets model.safetensors, config.json ({"model": ..., **extra_config}) and, when a
    tokenizer is given, tokenizer/. An existing non-empty out_dir is an error: a model folder is
    written new (or into an empty folder), never over one.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is a file, not a checkpoint directory; choose a new directory")
    check_folder_path(out_dir, "output directory")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir} already exists and is not empty; choose a new folder, or empty this one")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    config = SavedConfig.from_dict({"model": model.config.to_dict(), **(extra_config or {})})
    if tokenizer is not None and config.tokenizer is None:
        kind_and_size = {"kind": getattr(tokenizer, "kind", None), "vocab_size": tokenizer.vocab_size}
        config = dataclasses.replace(config, tokenizer=kind_and_size)
    try:
        with staged_dir(out_dir, replace=False) as tmp:
            _write_weights(model.state_dict(), model.config, tmp / WEIGHTS_FILE)
            _write_bytes_durably(tmp / CONFIG_FILE, config.to_json())
            if tokenizer is not None:
                save_tokenizer(tokenizer, tmp)
    except (OSError, SafetensorError) as exc:  # a full disk: name the folder, not the temporary one
        raise output_write_failed(out_dir, "the checkpoint", exc) from None
    return out_dir


# --------------------------------------------------------------------------------------------
# Finding and loading
# --------------------------------------------------------------------------------------------


def list_checkpoints(run_dir: Path | str) -> list[Path]:
    """Complete checkpoint directories of a run, oldest first (temp dirs are never listed)."""
    run_dir = Path(run_dir)
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _CKPT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path | str) -> Path | None:
    """The checkpoint `latest` names; if that pointer is missing or stale, the newest complete one."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    pointer = run_dir / LATEST_FILE
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        if _CKPT_RE.match(name) and (run_dir / name / WEIGHTS_FILE).is_file():
            return run_dir / name
    ckpts = [c for c in list_checkpoints(run_dir) if (c / WEIGHTS_FILE).is_file()]
    return ckpts[-1] if ckpts else None


def resolve_checkpoint(path: Path | str) -> Path:
    """A checkpoint directory from either a checkpoint directory or a run directory."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint or run directory")
    if (path / WEIGHTS_FILE).exists() or (path / CONFIG_FILE).exists():
        return path
    ckpt = latest_checkpoint(path)
    if ckpt is None:
        raise UserError(f"{path}: no checkpoint found (expected {WEIGHTS_FILE} or a run directory with '{LATEST_FILE}')")
    return ckpt


def is_hf_config(config: Any) -> bool:
    """Whether a parsed config.json is a Hugging Face model's (model_type or architectures, and no
    scratchlm 'model' section)."""
    return isinstance(config, dict) and not isinstance(config.get("model"), dict) and (
        "model_type" in config or "architectures" in config)


def load_tokenizer_near(ckpt_dir: Path) -> Any:
    """The tokenizer saved in the checkpoint directory or in its run directory, or None."""
    for directory in (ckpt_dir / TOKENIZER_DIR, ckpt_dir.parent / TOKENIZER_DIR):
        if directory.is_dir():
            from scratchlm.text.tokenizer import load_tokenizer

            return load_tokenizer(directory)
    return None


def load_model(path: Path | str, device: str | torch.device = "cpu",
               merged: bool = True) -> tuple[GPT, Any, dict[str, Any]]:
    """Load (model in eval mode on `device`, tokenizer or None, info) from a run or checkpoint dir.
    A LoRA run's checkpoint is its adapters on the run's base: merged into a plain GPT, or with
    `merged=False` left apart (to resume training them).

    info holds "checkpoint" (the directory read), "step" (None for weights-only checkpoints),
    "config" (the whole config.json, as SavedConfig.to_dict gives it) and "model_config" (a GPTConfig). Nothing here unpickles
    arbitrary objects: weights come from safetensors.
    """
    ckpt = resolve_checkpoint(path)
    saved = SavedConfig.read(ckpt)
    model_config = saved.model_config(ckpt)
    check_model_fits(model_config, "cpu")  # the weights are read on the CPU first
    weights = _read_weights(ckpt / WEIGHTS_FILE)
    if (saved.train or {}).get("lora_rank"):
        model = _lora_model(ckpt, saved, weights, merged)
    else:
        model = _model_from_weights(model_config, weights, ckpt / WEIGHTS_FILE)
    model.to(device).eval()
    tokenizer = load_tokenizer_near(ckpt)
    if tokenizer is not None and tokenizer.vocab_size > model_config.vocab_size:
        raise UserError(f"{ckpt}: its tokenizer has {tokenizer.vocab_size} tokens but the model only {model_config.vocab_size}; "
                        "they do not belong together. Put the run's own tokenizer/ folder beside the checkpoint")
    info = {"checkpoint": ckpt, "step": saved.step, "config": saved.to_dict(), "model_config": model_config}
    return model, tokenizer, info


def _lora_model(ckpt: Path, saved: SavedConfig, weights: dict[str, torch.Tensor], merged: bool) -> GPT:
    """The adapters of a LoRA checkpoint on its run's base, checked to be the base they were trained on."""
    from scratchlm.fileio import file_record
    from scratchlm.model.lora import add_lora, merge_lora

    base_dir, train = ckpt.parent / LORA_BASE_DIR, saved.train
    base_file = base_dir / WEIGHTS_FILE
    if not base_file.is_file():
        raise UserError(f"{ckpt}: a LoRA checkpoint holds only its adapters, and their base {base_dir} is missing; "
                        "keep the checkpoint inside its run folder")
    record = saved.extra.get("lora_base") or {}
    if record.get("sha256") != file_record(base_file)["sha256"]:
        raise UserError(f"{ckpt}: {base_dir} is not the base these adapters were trained on (its sha256 differs)")
    base_saved = SavedConfig.read(base_dir)
    model = _model_from_weights(base_saved.model_config(base_dir), _read_weights(base_file), base_file)
    add_lora(model, train["lora_rank"], train["lora_alpha"], train["lora_targets"], new_rows_from=record.get("new_rows_from"))
    own = dict(model.named_parameters())
    trainable = {n for n, p in own.items() if p.requires_grad}
    if set(weights) != trainable:
        raise UserError(f"{ckpt}: the adapters do not match the LoRA settings in config.json")
    with torch.no_grad():
        for name, tensor in weights.items():
            own[name].copy_(tensor)
    return merge_lora(model) if merged else model


def load_training_state(ckpt_dir: Path | str) -> tuple[dict, dict]:
    """(optimizer_state, trainer_state) of a checkpoint, read with torch.load(weights_only=True)."""
    ckpt_dir = Path(ckpt_dir)
    optimizer_state = _torch_load_safely(ckpt_dir / OPTIMIZER_FILE)
    trainer_state = from_safe(_torch_load_safely(ckpt_dir / TRAINER_STATE_FILE))
    return optimizer_state, trainer_state
