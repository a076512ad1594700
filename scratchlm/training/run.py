"""A training run's state and life: its folder (new or resumed), data, model and optimizer, the
counters the loop advances, evaluation, samples and checkpoints. scratchlm.training.train's loop drives a
`Run` one step at a time.
"""

from __future__ import annotations

import json
import math
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scratchlm.training import checkpoint as ckpt_io
from scratchlm.model.config import GPTConfig
from scratchlm.machine.cpu import auto_dtype
from scratchlm.training.distributed import Dist, any_rank, apply_fsdp, fsdp_load_optimizer, full_states, gather_objects
from scratchlm.errors import UserError
from scratchlm.fileio import cut_torn_tail, why_write_failed
from scratchlm.training.batches import RankBatches
from scratchlm.training.evaluation import evaluate, evaluate_full, sample_text
from scratchlm.machine.flops import device_peak, flops_per_token, si_units
from scratchlm.machine.memory import check_model_fits
from scratchlm.model.gpt import GPT
from scratchlm.training.optim import make_optimizer
from scratchlm.training.progress import Reporter
from scratchlm.training import run_folder
from scratchlm.training.train_config import TrainConfig


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


class Run:
    """One training run from its set-up to its end: the model and what drives it (optimizer,
    gradient scaler, batch stream), the counters the loop advances, and the small pieces the
    loop calls in turn: `count` a step, `log` it, `evaluate_sample_save` when due,
    `stop_requested`, and `finish`."""

    def __init__(self, cfg: TrainConfig, d: Dist, device: torch.device):
        if cfg.dtype == "auto":  # what this device multiplies natively; the run's config records the choice
            cfg.dtype = auto_dtype(device)
        if cfg.dtype == "float16" and device.type != "cuda":
            raise UserError("--dtype float16 needs a CUDA device (gradient scaling); use bfloat16 on CPU")
        self.cfg, self.d, self.device = cfg, d, device
        self.run_dir, self.resume_ckpt, self.lock = run_folder.take_run_folder(cfg, d, device)  # the folder is ours from here
        cfg.out_dir = str(self.run_dir)
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise

    def _set_up(self) -> None:
        from scratchlm.data import read_shard
        from scratchlm.text.tokenizer import load_tokenizer

        cfg, d, device = self.cfg, self.d, self.device
        # --- data and tokenizer ---
        self.source = None
        if self.resume_ckpt is not None:
            self.block_size = int(ckpt_io.SavedConfig.read(self.resume_ckpt).model["block_size"])
        elif cfg.init_from:  # its model and tokenizer: the new data is read with the source's tokenizer
            self.source = _load_source(cfg)
            self.block_size = self.source.model.config.block_size
        else:
            self.block_size = GPTConfig.from_name(cfg.model, **cfg.model_overrides).block_size
        self.prepared = _prepare_data(cfg, d, self.block_size)
        self.meta = json.loads((self.prepared / "meta.json").read_text(encoding="utf-8"))
        self.tokenizer = load_tokenizer(self.prepared / "tokenizer")
        if self.resume_ckpt is not None:  # the ids must mean what they meant: same data, same tokenizer
            _check_same_data(self.run_dir, self.resume_ckpt, self.meta)
            if (self.run_dir / ckpt_io.TOKENIZER_DIR).is_dir():
                self.tokenizer = load_tokenizer(self.run_dir / ckpt_io.TOKENIZER_DIR)  # the run's own
        self.train_tokens = read_shard(self.prepared / "train.bin")
        self.val_tokens = read_shard(self.prepared / "val.bin")
        self.bytes_per_token = self.meta["val_bytes"] / max(1, self.meta["val_tokens"])

        self._build_model()
        self.step, self.tokens_seen, self.bad_in_row, self.bad_total, self.elapsed_before = 0, 0, 0, 0, 0.0
        self.last_good_ckpt = self.resume_ckpt
        if self.resume_ckpt is not None:
            self._load_training_state()
            run_folder.check_steps_left(self.run_dir, self.step, cfg.max_steps)  # last: a broken checkpoint says so first
        # MFU's denominator: a datasheet figure or a bound on the CPU, (FLOP/s, where it comes from);
        # taken before the folder is made, since a bad SCRATCHLM_CPU_MAX_GHZ is an error
        self.peak_source = device_peak(device, cfg.dtype) if d.is_main else None
        self.peak = self.peak_source[0] if self.peak_source else None
        if d.is_main and self.resume_ckpt is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)  # only now: a run that fails to start leaves no folder behind
            run_folder.save_run_tokenizer(self.tokenizer, self.run_dir)
        if d.is_main and self.resume_ckpt is not None:
            _cut_torn_log(self.run_dir / METRICS_FILE)
        self.reporter = _RunReporter(self, cfg, self.run_dir, d.is_main, self.step)
        self.tokens_per_step = cfg.batch_size * self.block_size * cfg.grad_accum * d.world_size
        self.flops_token = flops_per_token(self.model_config).training  # the count `scratchlm inspect` prints
        self.losses: dict[int, float] = {}
        self.val_loss = self.bpb = None
        self.sample: str | None = None
        self.stopped = False
        self.interval_losses: list[float] = []  # finite losses since the last log line, for a smoother curve
        self._announce()

    def _step_size(self) -> dict:
        """A training step's batch, for scratchlm.machine.memory's check of what the step will hold."""
        return dict(batch=self.cfg.batch_size, seq_len=self.block_size, checkpointing=self.cfg.activation_checkpointing)

    def _build_model(self) -> None:
        """The model (new, or the checkpoint's), on its device and wrapped for several processes,
        its compiled forward, optimizer, gradient scaler and this process's batch stream."""
        cfg, d, device = self.cfg, self.d, self.device
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        vocab = self.tokenizer.vocab_size
        if cfg.pad_vocab_multiple > 1:
            vocab = -(-vocab // cfg.pad_vocab_multiple) * cfg.pad_vocab_multiple
        if self.resume_ckpt is not None:
            model, _, info = ckpt_io.load_model(self.resume_ckpt, device="cpu")
            self.model_config = info["model_config"]
            if self.model_config.vocab_size < self.tokenizer.vocab_size:
                raise UserError(f"{self.resume_ckpt}: the model's vocabulary is smaller than the data's tokenizer")
        elif self.source is not None:  # the source's weights, in a model of its own config (dropout may change)
            self.model_config = self.source.model.config.replace(**{k: v for k, v in cfg.model_overrides.items()
                                                                    if k == "dropout"})
            check_model_fits(self.model_config, device, training=True, **self._step_size())
            model = GPT(self.model_config)
            model.load_state_dict(self.source.model.state_dict())
        else:
            self.model_config = cfg.model_config(vocab)
            check_model_fits(self.model_config, device, training=True, **self._step_size())  # before a byte of it is allocated
            model = GPT(self.model_config)
        if d.rank:  # other ranks draw their own dropout masks; rank 0 matches a 1-process run
            torch.manual_seed(cfg.seed + d.rank)
        model.to(device).train()
        model.gradient_checkpointing = cfg.activation_checkpointing
        self.raw_model = model
        if cfg.fsdp and d.enabled:
            model = apply_fsdp(model, device, d)
        elif d.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.model = model
        self.forward = torch.compile(model) if cfg.compile else model
        self.optimizer = make_optimizer(model, cfg, device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=cfg.dtype == "float16")
        self.stream = RankBatches(self.train_tokens, cfg.batch_size, self.block_size, cfg.seed, d)

    def _load_training_state(self) -> None:
        optimizer_state, state = ckpt_io.load_training_state(self.resume_ckpt)
        if self.cfg.fsdp and self.d.enabled:
            fsdp_load_optimizer(self.model, self.optimizer, optimizer_state)
        else:
            self.optimizer.load_state_dict(optimizer_state["optimizer"])
        if optimizer_state.get("scaler"):
            self.scaler.load_state_dict(optimizer_state["scaler"])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.bad_in_row, self.bad_total = state["bad_in_row"], state["bad_total"]
        self.elapsed_before = state.get("elapsed_s", 0.0)
        per_rank = state["ranks"]
        mine = per_rank[self.d.rank] if len(per_rank) == self.d.world_size else per_rank[0]
        self.stream.load_state_dict(mine["data"])
        set_rng_state(mine["rng"])

    def _announce(self) -> None:
        cfg, d, raw = self.cfg, self.d, self.raw_model
        changed = {} if self.resume_ckpt is None else _changed_settings(ckpt_io.SavedConfig.read(self.resume_ckpt), cfg)
        if changed:
            self.reporter.say("resuming with changed settings: "
                              + ", ".join(f"{name} {old} \u2192 {new}" for name, (old, new) in changed.items()))
        self.reporter.record("start" if self.resume_ckpt is None else "resume", step=self.step, config=cfg.to_dict(),
                             **({"changed": changed} if changed else {}),
                             model=self.model_config.to_dict(), params=raw.num_params(), data_dir=str(self.prepared),
                             world_size=d.world_size, device=str(self.device))
        self.reporter.say(
            f"run {self.run_dir}: {raw.num_params():,} parameters, {self.meta['train_tokens']:,} training tokens, "
            f"{self.tokens_per_step:,} tokens/step, {si_units(self.flops_token)}FLOP per token (training), "
            f"device {self.device}" + (f" x{d.world_size}" if d.enabled else "")
            + (f", resuming at step {self.step}" if self.resume_ckpt is not None else "")
            + (f", starting from the {self.source.description}" if self.source is not None else "")
            + (f"; MFU is of {si_units(self.peak)}FLOP/s: {self.peak_source[1]}" if self.peak_source else "")
        )

    def begin(self) -> None:
        """Start the clocks: training time counts from here."""
        self.t_start = self.t_last = time.perf_counter()
        self.tokens_last, self.start_step = self.tokens_seen, self.step

    def count(self, loss_value: float, applied: bool) -> None:
        """One more step done: counters, the loss kept, a skipped update reported; too many
        skipped in a row stop the run with an error that says where the last good checkpoint is."""
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        if applied:
            self.bad_in_row = 0
        else:
            self.bad_in_row += 1
            self.bad_total += 1
            self.reporter.record("bad_step", step=self.step, loss=str(loss_value), in_a_row=self.bad_in_row)
            self.reporter.say(f"step {self.step}: non-finite loss ({loss_value}), update skipped "
                              f"({self.bad_in_row} in a row)")
        self.losses[self.step] = loss_value
        if math.isfinite(loss_value):
            self.interval_losses.append(loss_value)
        if self.bad_in_row >= self.cfg.max_bad_steps:
            where = (f"the last good checkpoint is {self.last_good_ckpt}" if self.last_good_ckpt
                     else "no checkpoint was saved yet")
            raise UserError(
                f"training stopped at step {self.step}: the loss was not finite for {self.bad_in_row} steps in a "
                f"row; {where}. Lower --lr, use --dtype float32 or check the data"
            )

    def log(self, loss_value: float, lr: float, norm: float) -> dict:
        """The step's record; at a log step also its mean loss, tokens/s and MFU, written and said."""
        cfg, step = self.cfg, self.step
        now = time.perf_counter()
        record = {"step": step, "loss": loss_value, "lr": lr, "tokens": self.tokens_seen}
        if step == self.start_step + 1 or step % cfg.log_interval == 0 or step == cfg.max_steps:
            dt = now - self.t_last
            tok_s = (self.tokens_seen - self.tokens_last) / dt if dt > 0 else 0.0
            self.t_last, self.tokens_last = now, self.tokens_seen
            mfu = self.flops_token * tok_s / self.d.world_size / self.peak if self.peak else None  # per device
            mean_loss = sum(self.interval_losses) / len(self.interval_losses) if self.interval_losses else None
            self.interval_losses.clear()
            record.update(loss_mean=mean_loss, tokens_per_s=tok_s, grad_norm=norm, mfu=mfu)
            self.reporter.record("train", **record)
            eta = (cfg.max_steps - step) * self.tokens_per_step / tok_s if tok_s else 0.0
            self.reporter.say(f"step {step}/{cfg.max_steps}: loss {loss_value:.4f}, lr {lr:.2e}, "
                              f"{tok_s:,.0f} tokens/s" + (f", MFU {100 * mfu:.1f}%" if mfu else "")
                              + f", ETA {eta:.0f}s")
            self.reporter.progress(step, loss_value, lr, tok_s)
        elif self.reporter.bar is not None:
            self.reporter.progress(step, loss_value, lr, (self.tokens_seen - self.tokens_last) / max(now - self.t_last, 1e-9))
        return record

    def evaluate_sample_save(self) -> None:
        """What is due at this step: validation (the whole split at the end, when small enough),
        a sample, a checkpoint (only after a good step)."""
        cfg, step = self.cfg, self.step
        last = step == cfg.max_steps
        if (cfg.eval_interval and step % cfg.eval_interval == 0) or last:
            full = last and (len(self.val_tokens) - 1) // self.block_size <= cfg.full_eval_windows
            self.val_loss, self.bpb = self.evaluate(step, full=full)
            if cfg.sample_interval == 0:
                self.sample = self.write_sample(step)
        if cfg.sample_interval and step % cfg.sample_interval == 0:
            self.sample = self.write_sample(step)
        if (cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0) or last:
            if self.bad_in_row == 0:
                self.last_good_ckpt = self.save(step)

    def stop_requested(self, stop: StopRequest, on_step, record: dict) -> bool:
        """Whether a signal (on any process) or on_step asked to stop; if so, save and say how to go on."""
        hook_stop = bool(on_step(self.step, record)) if (on_step is not None and self.d.is_main) else False
        if not any_rank(stop.requested or hook_stop, self.d, self.device) or self.step == self.cfg.max_steps:
            return False
        why = stop.signal_name or "a stop request"
        self.last_good_ckpt = self.save(self.step)
        self.reporter.record("stopped", step=self.step, reason=why)
        self.reporter.say(f"stopped at step {self.step} by {why}; saved {self.last_good_ckpt}. "
                          f"Continue with: scratchlm train --resume {self.run_dir}")
        self.stopped = True
        return True

    def save(self, at_step: int) -> Path | None:
        """A checkpoint of everything a resume needs (every process takes part; rank 0 writes)."""
        cfg, d, tok = self.cfg, self.d, self.tokenizer
        model_state, optimizer_state = full_states(self.raw_model, self.model, self.optimizer, cfg, d)
        ranks = gather_objects({"rng": rng_state(), "data": self.stream.state_dict()}, d)
        path = None
        if d.is_main:
            trainer_state = {"step": at_step, "tokens_seen": self.tokens_seen, "bad_in_row": self.bad_in_row,
                             "bad_total": self.bad_total,
                             "elapsed_s": self.elapsed_before + (time.perf_counter() - self.t_start), "ranks": ranks}
            config = ckpt_io.SavedConfig(
                model=self.model_config.to_dict(), train=cfg.to_dict(), data=_jsonable(asdict(_data_config(cfg))),
                data_sources=_data_identity(self.meta),
                tokenizer={"kind": tok.kind, "vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_id": tok.eos_id})
            scaler = self.scaler.state_dict() if self.scaler.is_enabled() else None
            try:
                path = ckpt_io.save_checkpoint(
                    self.run_dir, at_step, model_state, config,
                    optimizer_state={"optimizer": optimizer_state, "scaler": scaler},
                    trainer_state=trainer_state, keep_last=cfg.keep_last or None,
                )
            except UserError as exc:  # a full disk: say what the stop keeps and what it loses
                raise UserError(f"{exc}. {self.kept_and_lost()}") from None
            self.reporter.record("checkpoint", step=at_step, path=str(path))
        if d.enabled:
            import torch.distributed as dist

            dist.barrier()
        return path

    def kept_and_lost(self) -> str:
        """What a run that stops now keeps and loses (see run_folder.kept_and_lost)."""
        return run_folder.kept_and_lost(self.run_dir, self.last_good_ckpt, self.step)

    def evaluate(self, at_step: int, full: bool = False) -> tuple[float, float]:
        args = (self.model, self.val_tokens, self.cfg, self.block_size, self.device, self.d)
        val_loss = evaluate_full(*args) if full else evaluate(*args)
        bpb = val_loss / math.log(2) / self.bytes_per_token
        ppl = math.exp(min(val_loss, 50.0))
        self.reporter.record("eval", step=at_step, tokens=self.tokens_seen, val_loss=val_loss, val_ppl=ppl,
                             val_bpb=bpb, full=full)
        self.reporter.say(f"step {at_step}: val loss {val_loss:.4f}{' (whole validation split)' if full else ''}, "
                          f"perplexity {ppl:.2f}, bits/byte {bpb:.4f}")
        return val_loss, bpb

    def write_sample(self, at_step: int) -> str | None:
        cfg, d, device = self.cfg, self.d, self.device
        if cfg.sample_tokens == 0 or (cfg.fsdp and d.enabled) or not d.is_main:
            return None
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            text = sample_text(self.raw_model, self.tokenizer, cfg.sample_tokens, cfg.seed + at_step)
        self.reporter.record("sample", step=at_step, text=text)
        self.reporter.say(f"--- sample at step {at_step} ---\n{text}\n---")
        return text

    def close(self) -> None:
        """Close the log and let go of the run folder (every way a run ends comes here)."""
        reporter = getattr(self, "reporter", None)
        if reporter is not None:
            reporter.close()
        if self.lock is not None:
            self.lock.release()

    def finish(self) -> TrainResult:
        """The run's result, its last record and closing line."""
        elapsed = time.perf_counter() - self.t_start
        done_tokens = (self.step - self.start_step) * self.tokens_per_step
        result = TrainResult(
            run_dir=self.run_dir, step=self.step, tokens_seen=self.tokens_seen, losses=self.losses,
            val_loss=self.val_loss, val_bpb=self.bpb, elapsed_s=elapsed,
            tokens_per_s=done_tokens / elapsed if elapsed > 0 else 0.0, bad_steps=self.bad_total,
            stopped=self.stopped, sample=self.sample, is_main=self.d.is_main,
        )
        self.reporter.record("end", step=self.step, elapsed_s=elapsed, tokens_per_s=result.tokens_per_s,
                             val_loss=self.val_loss, val_bpb=self.bpb, bad_steps=self.bad_total, stopped=self.stopped)
        if not self.stopped:
            self.reporter.say(f"done: {self.step} steps in {elapsed:.1f}s ({result.tokens_per_s:,.0f} tokens/s), "
                              f"val loss {self.val_loss:.4f}; checkpoint in {self.run_dir}" if self.val_loss is not None
                              else f"done: {self.step} steps; checkpoint in {self.run_dir}")
        return result


METRICS_FILE = "metrics.jsonl"


class _RunReporter(Reporter):
    """The run's Reporter: a record that cannot be written to metrics.jsonl (a full disk) stops
    the run with one line naming the log and saying what is kept and what is lost. The write
    itself leaves no half record (scratchlm.fileio.append_line)."""

    def __init__(self, run: Run, *args) -> None:
        super().__init__(*args)
        self._run = run

    def record(self, event: str, **values: Any) -> None:
        try:
            super().record(event, **values)
        except OSError as exc:
            raise UserError(f"{self.metrics_path}: cannot append to the run's log: {why_write_failed(exc)}. "
                            f"{self._run.kept_and_lost()}") from None


def _cut_torn_log(path: Path) -> None:
    """Cut a torn last record off the run's log before a resume appends to it, and say so."""
    cut = cut_torn_tail(path)
    if cut:
        print(f"note: {path}: cut a torn last record ({cut} bytes, from a write that did not finish); the records "
              "before it are kept", file=sys.stderr)


def _changed_settings(saved: ckpt_io.SavedConfig, cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """The training settings a resume changes: {name: (saved value, value now)} (how progress is
    shown, and where the run is, are not training settings)."""
    then, now = saved.train or {}, cfg.to_dict()
    return {name: (then[name], value) for name, value in now.items()
            if name not in ("resume", "out_dir", "progress") and name in then and then[name] != value}


def _load_source(cfg: TrainConfig):
    """The model `--init_from` names, and its tokenizer made the run's: data preparation reads
    the new text with it (a character it cannot encode is an error naming it)."""
    from scratchlm.data import cache_root
    from scratchlm.training.sources import load_source

    if cfg.resume:
        raise UserError("--init_from starts a new run; --resume continues one: give one or the other")
    cache = Path(cfg.data_cache).expanduser() if cfg.data_cache else cache_root()
    source = load_source(cfg.init_from, cache)
    cfg.tokenizer, cfg.tokenizer_file, cfg.vocab_size = source.tokenizer.kind, str(source.tokenizer_dir), None
    return source


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
        if not Path(run_dir).exists():
            why = "no such folder"
        elif run_folder.killed_while_starting(Path(run_dir)):
            why = ("a run killed while it started, before its first step: start it again with the same command and "
                   f"--out_dir {run_dir}")
        elif run_folder.stopped_before_first_checkpoint(Path(run_dir)):
            why = ("a run stopped before its first checkpoint leaves nothing to continue: delete the folder and "
                   "start the run again, or start it in another --out_dir")
        else:
            why = "not a run folder?"
        raise UserError(f"{run_dir}: no checkpoint to resume from ({why})")
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


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
