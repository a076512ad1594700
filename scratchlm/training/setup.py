"""A training run's setup: what it decides before its first step, once and in this order, into a
record that nothing changes afterwards (`RunSetup`):

    1. dtype         what the run computes in (`auto`: what the device multiplies natively)
    2. run folder    a new one, or the run to resume; locked for this one writer from here on
    3. tokenizer     the config's, or the one of the model `--init_from` names
    4. model config  the resumed checkpoint's, the source's (only dropout may change), or the
                     preset's with the overrides; its block size is the run's context length
    5. data          token shards prepared (or found in the cache) with that tokenizer, checked
                     against that block size; a resumed run's must be the data it began on
    6. vocabulary    a new model's is the tokenizer's, rounded up to pad_vocab_multiple; a
                     resumed or source model keeps its own, which must hold the tokenizer's

The given TrainConfig is never changed: the decisions are written into a copy (`RunSetup.cfg`),
which is what the run's log and its checkpoints record.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from scratchlm.errors import UserError
from scratchlm.model.config import GPTConfig
from scratchlm.runlock import RunLock
from scratchlm import checkpoint as ckpt_io
from scratchlm.training import run_folder
from scratchlm.training.distributed import Dist
from scratchlm.training.precision import choose_dtype
from scratchlm.training.sources import Source
from scratchlm.training.train_config import SOURCE_MAY_CHANGE, TrainConfig


@dataclass(frozen=True)
class RunSetup:
    """What a run decided before its first step (see the module's docstring)."""

    cfg: TrainConfig
    """The given config with the decisions written in (dtype, out_dir, a source's tokenizer)."""
    d: Dist
    device: torch.device
    run_dir: Path
    resume_ckpt: Path | None
    """The checkpoint a resumed run continues from; None for a new run."""
    lock: RunLock | None
    """The run folder's lock, held by the main process until the run ends."""
    source: Source | None
    """The model and tokenizer `--init_from` names (a new run only)."""
    data_dir: Path
    """The prepared data: train and val shards, meta.json and the tokenizer they were made with."""
    meta: dict[str, Any]
    tokenizer: Any
    train_tokens: Any
    val_tokens: Any
    model_config: GPTConfig
    lora_base: dict = field(default_factory=dict)
    """A LoRA run's base record (sha256 of RUN/base, where it came from, its first trained row),
    filled once the folder is the run's (scratchlm.training.lora_run.base_record)."""
    fine_tuning: Any = None
    """The sft stage's conversations, rendered (a FineTuningData); None in pre-training, whose
    data are train_tokens and val_tokens."""

    @property
    def block_size(self) -> int:
        """The run's context length: the model's."""
        return self.model_config.block_size

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains on, over every process (the sft stage's padded rows: at most this)."""
        return self.cfg.batch_size * self.block_size * self.cfg.grad_accum * self.d.world_size

    @property
    def bytes_per_token(self) -> float:
        """Of the validation text: turns a loss in nats per token into bits per byte."""
        return self.meta["val_bytes"] / max(1, self.meta["val_tokens"])

    def saved_config(self) -> ckpt_io.SavedConfig:
        """What every checkpoint of the run records besides its step."""
        tok = self.tokenizer
        return ckpt_io.SavedConfig(
            model=self.model_config.to_dict(), train=self.cfg.to_dict(), data=_jsonable(asdict(_data_config(self.cfg))),
            data_sources=_data_identity(self.meta),
            tokenizer={"kind": tok.kind, "vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_id": tok.eos_id},
            extra={"lora_base": dict(self.lora_base)} if self.lora_base else {})

    def release(self) -> None:
        """Let go of the run folder (every way a run ends comes here)."""
        if self.lock is not None:
            self.lock.release()


def set_up_run(cfg: TrainConfig, d: Dist, device: torch.device) -> RunSetup:
    """Decide everything of the module's docstring, in its order. Every process calls it; the
    main one takes the folder's lock, which is let go again when a later step fails."""
    cfg = dataclasses.replace(cfg, dtype=choose_dtype(cfg.dtype, device))  # 1. the run's config records the choice
    run_dir, resume_ckpt, lock = run_folder.take_run_folder(cfg, d, device)  # 2. the folder is ours from here
    try:
        cfg = dataclasses.replace(cfg, out_dir=str(run_dir))
        if cfg.stage == "sft":
            return _set_up_fine_tuning(cfg, d, device, run_dir, resume_ckpt, lock)
        source = None
        if resume_ckpt is None and cfg.init_from:  # 3. the source's tokenizer: the new data is read with it
            source = _load_source(cfg)
            cfg = dataclasses.replace(cfg, tokenizer=source.tokenizer.kind, tokenizer_file=str(source.tokenizer_dir),
                                      vocab_size=None)
        shape = _model_shape(cfg, resume_ckpt, source)  # 4.
        data_dir = _prepare_data(cfg, d, shape.block_size)  # 5.
        meta = json.loads((data_dir / "meta.json").read_text(encoding="utf-8"))
        tokenizer = _run_tokenizer(data_dir, run_dir, resume_ckpt, meta)
        model_config = _fit_vocabulary(shape, cfg, tokenizer, resume_ckpt, source)  # 6.
        from scratchlm.data import read_split

        return RunSetup(cfg=cfg, d=d, device=device, run_dir=run_dir, resume_ckpt=resume_ckpt, lock=lock,
                        source=source, data_dir=data_dir, meta=meta, tokenizer=tokenizer,
                        train_tokens=read_split(data_dir, "train", meta), val_tokens=read_split(data_dir, "val", meta),
                        model_config=model_config)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _set_up_fine_tuning(cfg: TrainConfig, d: Dist, device: torch.device, run_dir: Path, resume_ckpt: Path | None,
                        lock: RunLock | None) -> RunSetup:
    """Steps 3 to 6 for the sft stage: the source's tokenizer (a resumed run's own) given the chat
    tokens, the conversations read and rendered with it (scratchlm.training.sft_data), and the
    source's model config with room for the new ids (the rows themselves: parts.build_model)."""
    from scratchlm.data.conversations import CONVERSATION_SUFFIXES
    from scratchlm.data.tang_sft import is_tang_sft, tang_sft
    from scratchlm.fileio import file_record
    from scratchlm.text.tokenizer import load_tokenizer
    from scratchlm.training.sft_data import fine_tuning_data
    from scratchlm.training.vocab_rows import rows_for

    data_path = tang_sft("train") if is_tang_sft(cfg.data) else Path(cfg.data)  # the built-in requests, or a file
    if data_path.suffix.lower() not in CONVERSATION_SUFFIXES:
        raise UserError(f"the sft stage learns from conversations: give --data FILE.jsonl or FILE.parquet, or "
                        f"tang-sft (got {cfg.data!r})")
    source = None
    if resume_ckpt is None:
        if not cfg.init_from:
            raise UserError("the sft stage fine-tunes a trained model: give --init_from RUN_OR_HF_DIR")
        source = _load_source(cfg)
        cfg = dataclasses.replace(cfg, tokenizer=source.tokenizer.kind, tokenizer_file=str(source.tokenizer_dir),
                                  vocab_size=None)
        base_tokenizer = source.tokenizer
    else:
        base_tokenizer = load_tokenizer(run_dir / ckpt_io.TOKENIZER_DIR)
    shape = _model_shape(cfg, resume_ckpt, source)
    data = fine_tuning_data(data_path, base_tokenizer, block_size=shape.block_size, val_fraction=cfg.val_fraction,
                            seed=cfg.seed, train_on=cfg.train_on)
    targets = sum(sum(row.loss_mask[1:]) for row in data.val_rows)
    meta = {"train_tokens": sum(len(row.ids) for row in data.train_rows), "val_tokens": targets,
            "val_bytes": data.val_bytes_per_target * targets, "sources": [file_record(data_path)],
            "tokenizer": data.tokenizer.kind, "vocab_size": data.tokenizer.vocab_size}
    if resume_ckpt is not None:  # other data first: it is why a vocabulary would have grown
        _check_same_data(run_dir, resume_ckpt, meta)
    if shape.vocab_size < data.tokenizer.vocab_size:
        if resume_ckpt is not None:
            raise UserError(f"{resume_ckpt}: the model's vocabulary is smaller than the run's tokenizer")
        shape = shape.replace(vocab_size=rows_for(shape.vocab_size, data.tokenizer.vocab_size, cfg.pad_vocab_multiple))
    return RunSetup(cfg=cfg, d=d, device=device, run_dir=run_dir, resume_ckpt=resume_ckpt, lock=lock, source=source,
                    data_dir=data_path, meta=meta, tokenizer=data.tokenizer, train_tokens=None, val_tokens=None,
                    model_config=shape, fine_tuning=data)


def _load_source(cfg: TrainConfig) -> Source:
    """The model `--init_from` names, and its tokenizer made the run's: data preparation reads
    the new text with it (a character it cannot encode is an error naming it)."""
    from scratchlm.data import cache_root
    from scratchlm.training.sources import load_source

    if cfg.resume:
        raise UserError("--init_from starts a new run; --resume continues one: give one or the other")
    cache = Path(cfg.data_cache).expanduser() if cfg.data_cache else cache_root()
    return load_source(cfg.init_from, cache)


def _model_shape(cfg: TrainConfig, resume_ckpt: Path | None, source: Source | None) -> GPTConfig:
    """The model's config before the data is known: a resumed run's checkpoint's, the source's
    with its dropout changed if asked, else the preset's with the overrides (its vocabulary is
    settled in `_fit_vocabulary`)."""
    if resume_ckpt is not None:
        return ckpt_io.SavedConfig.read(resume_ckpt).model_config(resume_ckpt)
    if source is not None:  # the source's weights go into a model of its own config (dropout, context may change)
        config = source.model.config
        changed = {k: v for k, v in cfg.model_overrides.items() if k in SOURCE_MAY_CHANGE}
        if changed.get("block_size", config.block_size) != config.block_size and config.pos_embedding == "learned":
            raise UserError(f"{cfg.init_from}: its position table has {config.block_size} learned rows, so its context "
                            f"cannot become {changed['block_size']}; drop --block_size (a RoPE model's can change)")
        return config.replace(**changed)
    return GPTConfig.from_name(cfg.model, **cfg.model_overrides)


def _run_tokenizer(data_dir: Path, run_dir: Path, resume_ckpt: Path | None, meta: dict) -> Any:
    """The tokenizer the data was prepared with; a resumed run's own, once its ids are known to
    mean what they meant (the same data, the same tokenizer)."""
    from scratchlm.text.tokenizer import load_tokenizer

    if resume_ckpt is None:
        return load_tokenizer(data_dir / "tokenizer")
    _check_same_data(run_dir, resume_ckpt, meta)
    own = run_dir / ckpt_io.TOKENIZER_DIR
    return load_tokenizer(own if own.is_dir() else data_dir / "tokenizer")


def _fit_vocabulary(shape: GPTConfig, cfg: TrainConfig, tokenizer: Any, resume_ckpt: Path | None,
                    source: Source | None) -> GPTConfig:
    """A new model's vocabulary is the tokenizer's, padded; a resumed or source model keeps its own
    (a resumed one's must still hold every id of the tokenizer)."""
    from scratchlm.data import padded_vocab_size

    if resume_ckpt is not None and shape.vocab_size < tokenizer.vocab_size:
        raise UserError(f"{resume_ckpt}: the model's vocabulary is smaller than the data's tokenizer")
    if resume_ckpt is not None or source is not None:
        return shape
    return shape.replace(vocab_size=padded_vocab_size(tokenizer.vocab_size, cfg.pad_vocab_multiple))


def _data_config(cfg: TrainConfig, block_size: int | None = None):
    from scratchlm.data import DataConfig

    values: dict[str, Any] = dict(data=cfg.data, tokenizer=cfg.tokenizer, val_fraction=cfg.val_fraction,
                                  block_size=block_size, errors=cfg.errors)
    if cfg.vocab_size is not None:
        values["vocab_size"] = cfg.vocab_size
    if cfg.tokenizer_file is not None:
        values["tokenizer_file"] = cfg.tokenizer_file
    return DataConfig(**values)


def _prepare_data(cfg: TrainConfig, d: Dist, block_size: int) -> Path:
    """Prepare (or find) the token shards; rank 0 first so processes never race on the cache."""
    from scratchlm.data import ensure_prepared

    data_cfg = _data_config(cfg, block_size)
    cache = Path(cfg.data_cache) if cfg.data_cache else None
    if d.enabled:
        import torch.distributed as dist

        if d.is_main:
            prepared = ensure_prepared(data_cfg, cache)
        dist.barrier()
        if not d.is_main:
            prepared = ensure_prepared(data_cfg, cache)
        return Path(prepared)
    return Path(ensure_prepared(data_cfg, cache))


def _data_identity(meta: dict) -> list[dict]:
    """What the run's token ids were made from: each source file's size and sha256 (its path too,
    for the message; a moved file with the same bytes is the same data)."""
    return [{"path": s["path"], "bytes": s["bytes"], "sha256": s["sha256"]} for s in meta.get("sources", [])]


def _check_same_data(run_dir: Path, ckpt: Path, meta: dict) -> None:
    """Refuse to resume on other data or another tokenizer than the run was trained on: its ids
    would silently mean other characters or words (a char tokenizer renumbers when one character
    goes; appended text shifts every batch)."""
    saved = ckpt_io.SavedConfig.read(ckpt)
    then, now = saved.data_sources, _data_identity(meta)
    tokenizer = saved.tokenizer or {}
    what = None
    if then is not None and [(s["bytes"], s["sha256"]) for s in then] != [(s["bytes"], s["sha256"]) for s in now]:
        if len(then) != len(now):
            what = f"{len(then)} source file(s) then, {len(now)} now"
        else:
            old, new = next((a, b) for a, b in zip(then, now) if (a["bytes"], a["sha256"]) != (b["bytes"], b["sha256"]))
            what = (f"{Path(new['path']).name}: {old['bytes']:,} bytes, sha256 {old['sha256'][:12]} then; "
                    f"{new['bytes']:,} bytes, sha256 {new['sha256'][:12]} now")
    elif tokenizer and (tokenizer.get("kind"), tokenizer.get("vocab_size")) != (meta["tokenizer"], meta["vocab_size"]):
        what = (f"tokenizer {tokenizer.get('kind')} of {tokenizer.get('vocab_size')} ids then, "
                f"{meta['tokenizer']} of {meta['vocab_size']} now")
    if what is not None:
        raise UserError(f"{run_dir}: the training data changed since the run began ({what}), so its token ids would "
                        "no longer mean what the model learned; resume on the original data, or start a new run "
                        "in another --out_dir")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
