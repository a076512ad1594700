"""The model a run trains and what a training step works on (`TrainParts`): the model wrapped
for several processes (DDP or FSDP2), its forward pass (compiled or not), the optimizer, the
gradient scaler and this process's batches. Built once, from what the run's setup decided.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from scratchlm.errors import UserError
from scratchlm.kernels.training_copy import attach_training_kernels
from scratchlm.machine.memory import check_model_fits
from scratchlm.model.gpt import GPT
from scratchlm import checkpoint as ckpt_io
from scratchlm.training.batches import RankBatches
from scratchlm.training.distributed import apply_fsdp
from scratchlm.training.lora_run import adapt
from scratchlm.training.optim import make_optimizer
from scratchlm.training.sft_batches import ConversationBatches
from scratchlm.training.vocab_rows import grow_vocabulary
from scratchlm.training.setup import RunSetup


@dataclass
class TrainParts:
    """What one training step (scratchlm.training.train.train_step) works on."""

    model: torch.nn.Module
    """The model as the step calls it: the GPT, or its DDP or FSDP2 wrapping."""
    forward: Callable[..., Any]
    """model's forward pass: the model itself, or torch.compile of it."""
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    """float16's gradient scaler; disabled (each call a no-op) in other precisions."""
    batches: Any
    """next_batch() -> (x, y), each (B, T): this process's batches (a RankBatches)."""


def build_model(setup: RunSetup) -> GPT:
    """The run's GPT on its device, in training mode: new, the source's weights, or the
    checkpoint's, with the compiled training attention and GELU attached on a CPU
    (scratchlm.kernels.training_copy). Seeded first, so a new model is the same for a seed."""
    cfg, d = setup.cfg, setup.d
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if setup.resume_ckpt is not None:  # a LoRA run's adapters stay apart from its base
        model, _, _ = ckpt_io.load_model(setup.resume_ckpt, device="cpu", merged=False)
    else:
        check_model_fits(setup.model_config, setup.device, training=True, batch=cfg.batch_size,  # before a byte
                         seq_len=setup.block_size, checkpointing=cfg.activation_checkpointing)  # of it is allocated
        model = _source_model(setup) if setup.source is not None else GPT(setup.model_config)
        if cfg.lora_rank:
            model = adapt(model, cfg, setup.fine_tuning.added_ids if setup.fine_tuning is not None else [])
            if d.is_main:
                trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
                print(f"note: LoRA of rank {cfg.lora_rank} on {cfg.lora_targets}: {trained:,} of "
                      f"{model.num_params():,} parameters train, the rest stay the base's", file=sys.stderr)
    if d.rank:  # other ranks draw their own dropout masks; rank 0 matches a 1-process run
        torch.manual_seed(cfg.seed + d.rank)
    model.to(setup.device).train()
    model.gradient_checkpointing = cfg.activation_checkpointing
    if setup.device.type == "cpu":  # float32's compiled attention and GELU (each steps aside where it does not apply)
        attach_training_kernels(model)
    return model


def _source_model(setup: RunSetup) -> GPT:
    """The --init_from source's weights in a model of the run's config: the same, but for dropout
    and, in fine-tuning, rows for the ids the tokenizer gained (scratchlm.training.vocab_rows)."""
    source = setup.source.model
    if source.config == setup.model_config.replace(vocab_size=source.config.vocab_size):
        model = source  # the run trains the source's own tensors: no second model's memory
    else:  # another dropout: a model of the run's config, holding the source's weights
        model = GPT(setup.model_config.replace(vocab_size=source.config.vocab_size))
        model.load_state_dict(source.state_dict())
    setup.source.model = source = None  # its weights are the run's now
    added = setup.fine_tuning.added_ids if setup.fine_tuning is not None else []
    model, said = grow_vocabulary(model, setup.source.tokenizer.vocab_size, added, setup.cfg.pad_vocab_multiple)
    if model.config != setup.model_config:
        raise AssertionError(f"the source's model grew to {model.config}, not the run's {setup.model_config}")
    if said and setup.d.is_main:
        print(f"note: {said}", file=sys.stderr)
    return model


def make_parts(model: GPT, setup: RunSetup) -> TrainParts:
    """`model` wrapped for several processes (when there are), its forward, a fresh optimizer and
    gradient scaler, and this process's batch stream from the start of the training tokens."""
    cfg, d, device = setup.cfg, setup.d, setup.device
    wrapped: torch.nn.Module = model
    if cfg.fsdp and d.enabled:
        wrapped = apply_fsdp(model, device, d)
    elif d.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return TrainParts(
        model=wrapped,
        forward=torch.compile(wrapped) if cfg.compile else wrapped,
        optimizer=make_optimizer(wrapped, cfg, device),
        scaler=torch.amp.GradScaler("cuda", enabled=cfg.dtype == "float16"),
        batches=_batches(setup),
    )


def _batches(setup: RunSetup):
    """This process's batches: windows of the training tokens, or the fine-tuning stage's
    conversations (padded with EOS, which the targets leave out)."""
    cfg, d = setup.cfg, setup.d
    if setup.fine_tuning is not None:
        return ConversationBatches(setup.fine_tuning.train_rows, cfg.batch_size, setup.block_size, cfg.seed,
                                   pad_id=setup.tokenizer.eos_id, d=d)
    return RankBatches(setup.train_tokens, cfg.batch_size, setup.block_size, cfg.seed, d,
                       starts=_window_starts(setup) if cfg.windows == "lines" else None)


def _window_starts(setup: RunSetup):
    """--windows lines: the positions after each id that ends a line (its text ends in a newline:
    "\n", and in a BPE "\n\n" or ".\n" too) or is BOS, in the training tokens."""
    from scratchlm.data.shards import line_starts

    tok = setup.tokenizer
    skip = set(getattr(tok, "special_ids", ())) | {getattr(tok, "unk_id", None)}
    ends = [i for i in range(tok.vocab_size) if i not in skip and tok.decode([i]).endswith("\n")]
    if not ends:
        raise UserError(f"--windows lines needs a tokenizer with a newline in its vocabulary; this {tok.kind} "
                        "tokenizer has none: use --windows anywhere")
    return line_starts(setup.train_tokens, ends, getattr(tok, "bos_id", None))
