"""Where `train --init_from` starts: a trained model and its tokenizer, from a scratchlm run or
checkpoint, or from a local Hugging Face model folder (what `import-hf` reads).

The new run keeps the source's architecture and tokenizer (its ids must keep their meaning for
the weights to be of any use) and starts a fresh optimizer and learning-rate schedule on its own
data. The tokenizer is handed to data preparation as a saved tokenizer folder: the run's or
checkpoint's own `tokenizer/`, or, for a Hugging Face folder, a copy saved once in scratchlm's
cache (named by the folder's place and its tokenizer files' bytes: a changed file is read afresh).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchlm.errors import UserError


@dataclass
class Source:
    model: Any
    """The GPT, in float32 on the CPU."""
    tokenizer: Any
    tokenizer_dir: Path
    """A saved tokenizer folder that data preparation loads (`--tokenizer_file`)."""
    description: str


def _is_hf_folder(path: Path) -> bool:
    from scratchlm.checkpoint import is_hf_config

    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return False
    return is_hf_config(values)


def _tokenizer_digest(path: Path) -> str:
    """Names the cached copy of a Hugging Face folder's tokenizer: its place and its files' bytes,
    so a tokenizer.json changed since (or a copy read by an older scratchlm) is never reused."""
    digest = hashlib.sha256(f"{path.resolve()}\0ids-kept".encode())
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        if (path / name).is_file():
            digest.update(f"\0{name}\0".encode() + (path / name).read_bytes())
    return digest.hexdigest()[:12]


def load_source(path: str | Path, cache: Path) -> Source:
    """The model and tokenizer at `path` (see the module's docstring). `cache` holds the saved
    copy of a Hugging Face folder's tokenizer."""
    from scratchlm.checkpoint import TOKENIZER_DIR, load_model, resolve_checkpoint

    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"--init_from {path}: no such run, checkpoint or Hugging Face folder")
    if _is_hf_folder(path):
        from scratchlm.hf.interop import import_hf_dir, import_hf_tokenizer

        model = import_hf_dir(path)
        tokenizer = import_hf_tokenizer(path)
        if tokenizer is None:
            raise UserError(f"--init_from {path}: its tokenizer is not one scratchlm reads (GPT-2's byte-level BPE, "
                            "or a tokenizer.json that export-hf wrote); a model cannot be trained on without it")
        folder = cache / "init_from" / f"{path.name}-{_tokenizer_digest(path)}"
        if not (folder / TOKENIZER_DIR).is_dir():
            from scratchlm.checkpoint import save_tokenizer

            folder.mkdir(parents=True, exist_ok=True)
            save_tokenizer(tokenizer, folder)
        return Source(model, tokenizer, folder / TOKENIZER_DIR, f"Hugging Face folder {path}")
    ckpt = resolve_checkpoint(path)
    model, tokenizer, info = load_model(ckpt)
    if tokenizer is None:
        raise UserError(f"--init_from {path}: no tokenizer saved with it; a model cannot be trained on without one")
    folder = next(d for d in (ckpt / TOKENIZER_DIR, ckpt.parent / TOKENIZER_DIR) if d.is_dir())
    step = f" at step {info['step']}" if info["step"] is not None else ""
    return Source(model, tokenizer, folder, f"checkpoint {ckpt}{step}")
