"""Sizes checked before memory is touched: what a model, its training state, a batch or a
generation will need, against what the device has free, so a size typed with one zero too many
is one clear error naming the knob, not an allocation failure deep inside torch (or the machine
swapping to a halt).

One estimate serves every command (`footprint` of a `Workload`), in four parts:
  parameters   the weights in float32 (param_bytes each); training adds their gradients and
               AdamW's two moments (TRAINING_BYTES_PER_PARAM)
  activations  training: what autograd keeps of a (B, T) batch for the backward pass
               (scratchlm.machine.training_memory.saved_activations, checked there against what autograd really
               saves) and the loss's two B*T*V buffers; a forward without gradients: what one
               block holds at once, with its (T, T) attention weights; attention maps: every
               layer's (T, T) weights, kept for drawing
  kv_cache     keys and values of every layer for every generated row, the whole context
  output       the logits of the batch (or, decoding, a step's scores and their sorted copy) and
               the ids
and, for a model built on the meta device (shapes without weights), its Python objects alone
(`modules`: MODULE_BYTES_PER_LAYER a block), which a config of 10**8 layers makes terabytes.
Figures are float32 (bfloat16 autocast keeps some activations in half the bytes) and leave out
allocator slack and short-lived buffers: enough to refuse a size that cannot fit, which is what
they are for, not a promise that everything below them does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from scratchlm.errors import UserError
from scratchlm.machine.flops import count_params
from scratchlm.machine.training_memory import memory_estimate
from scratchlm.model.config import GPTConfig

TRAINING_BYTES_PER_PARAM = 16
"""float32 weights, their gradients and AdamW's two moments: 4 + 4 + 8 bytes."""

MODULE_BYTES_PER_LAYER = 28_000
"""The Python objects of one block (its modules and parameter objects), measured with tracemalloc
on the meta device (where the weights take nothing): about 28 KB."""

FLOAT = 4
ID = 8  # int64 token ids


@dataclass(frozen=True)
class Footprint:
    """Bytes a command will hold at its peak (see the module's docstring for each part)."""

    parameters: int = 0
    activations: int = 0
    kv_cache: int = 0
    output: int = 0
    modules: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.activations + self.kv_cache + self.output + self.modules

    def parts(self) -> str:
        """The parts that are not zero, as 'parameters 1.2 GB + output 3.4 GB'."""
        named = [(f.name.replace("_", " "), getattr(self, f.name)) for f in fields(self)]
        return " + ".join(f"{name} {human_bytes(n)}" for name, n in named if n) or "nothing"


def _training_activations(config: GPTConfig, batch: int, seq_len: int, checkpointing: bool = False) -> int:
    """What a training step keeps for its backward pass (float32), the larger of PyTorch's
    attention and the compiled one (which keeps its (T, T) weights). Worked out for one and two
    layers and extended, since a block keeps the same as the next: n_layer may be any size."""
    def kept(n_layer: int, attention: str) -> int:
        estimate = memory_estimate(config.replace(n_layer=n_layer), batch, seq_len, "fp32", attention)
        kept = estimate.activations_checkpointed if checkpointing else estimate.activations
        return kept + estimate.loss_temporaries

    per_model = []
    for attention in ("sdpa", "compiled"):
        one, two = kept(1, attention), kept(2, attention)
        per_model.append(one + (config.n_layer - 1) * (two - one))
    return max(per_model)


def _forward_activations(config: GPTConfig, batch: int, seq_len: int) -> int:
    """What a forward pass without gradients holds at once: the residual stream and one block's
    intermediates (norm output, q k v, attention output, the MLP's hidden layer and its activation)
    and one head set of (T, T) attention weights."""
    BT = batch * seq_len
    return FLOAT * (BT * (6 * config.n_embd + 2 * config.mlp_hidden) + batch * config.n_head * seq_len * seq_len)


@dataclass(frozen=True)
class Workload:
    """What a command does with a model, for `footprint`: nothing (the weights alone) unless told.
    batch, seq_len: a (B, T) batch through the model, a training step when `training` (with
    activation `checkpointing`: each block's input kept, one block recomputed at a time);
    attention_maps: the (T, T) weights of every layer kept; rows: sequences decoded at once
    (samples or beams), with prompt_tokens + new_tokens ids each."""

    batch: int = 0
    seq_len: int = 0
    training: bool = False
    checkpointing: bool = False
    attention_maps: bool = False
    rows: int = 0
    new_tokens: int = 0
    prompt_tokens: int = 0


def footprint(config: GPTConfig, work: Workload = Workload(), param_bytes: int = FLOAT) -> Footprint:
    """The estimate of the module's docstring for `work` on a model of `config`; param_bytes:
    bytes per parameter held (0: none, as for a model on the meta device; a training step holds
    TRAINING_BYTES_PER_PARAM whatever it says)."""
    params = count_params(config)["total"]
    parameters = params * (TRAINING_BYTES_PER_PARAM if work.training else param_bytes)
    activations = output = kv_cache = 0
    B, T = work.batch, work.seq_len
    if B and T:
        activations = (_training_activations(config, B, T, work.checkpointing) if work.training
                       else _forward_activations(config, B, T))
        if work.attention_maps:
            activations += FLOAT * config.n_layer * B * config.n_head * T * T
        output = FLOAT * B * T * config.vocab_size + ID * B * T * (2 if work.training else 1)
    if work.rows:
        kv_cache = 2 * FLOAT * config.n_layer * work.rows * config.block_size * config.kv_heads * config.head_dim
        output += 3 * FLOAT * work.rows * config.vocab_size + ID * work.rows * (work.prompt_tokens + work.new_tokens)
    return Footprint(parameters, activations, kv_cache, output)


CGROUP = "/sys/fs/cgroup"
"""This process's cgroup (v2) folder as a container sees it: memory.max, memory.current, memory.stat."""
MEMINFO = "/proc/meminfo"


def _cgroup_free() -> int | None:
    """What this process's cgroup (v2) still allows, where it sets a limit (a container): the limit
    less what is in use. memory.current counts the page cache of every file read (a run's data, a
    checkpoint), which the kernel drops before it refuses memory; its inactive part (memory.stat's
    inactive_file) is left out of the use, as MemAvailable counts reclaimable cache as free for the
    machine. The active part is kept in: a file in use now may not be dropped without a cost."""
    try:
        limit = Path(CGROUP, "memory.max").read_text(encoding="ascii").strip()
        used = int(Path(CGROUP, "memory.current").read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    if limit == "max" or not limit.isdigit():
        return None
    return max(0, int(limit) - max(0, used - _cgroup_stat("inactive_file")))


def _cgroup_stat(key: str) -> int:
    """One figure of the cgroup's memory.stat, in bytes; 0 when it cannot be read."""
    try:
        with open(Path(CGROUP, "memory.stat"), encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def available_bytes(device: torch.device | str) -> int | None:
    """Memory free for new allocations on `device` (None where it cannot be told)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    free = None
    try:
        with open(MEMINFO, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return _cgroup_free()
    limited = _cgroup_free()
    return free if limited is None else min(free, limited)


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def check_fits(need: Footprint | int, device: torch.device | str, what: str, knobs: str) -> None:
    """One clear error when `need` (a Footprint, or bytes) exceeds what `device` has free, naming
    the size, its parts and what to lower."""
    total = need.total if isinstance(need, Footprint) else int(need)
    if torch.device(device).type == "meta":
        return
    free = available_bytes(device)
    if free is not None and total > free:
        parts = f" ({need.parts()})" if isinstance(need, Footprint) else ""
        raise UserError(f"{what} needs about {human_bytes(total)}{parts}, but {torch.device(device)} has "
                        f"{human_bytes(free)} free; lower {knobs}")


MODEL_KNOBS = "vocab_size, n_embd, n_layer or n_inner"


def check_model_fits(config: GPTConfig, device: torch.device | str, training: bool = False, batch: int = 0,
                     seq_len: int = 0, checkpointing: bool = False) -> None:
    """The model's parameters (with gradients and optimizer state when training), in float32, and
    where a batch is given, what a training step (or a forward pass) of it holds."""
    need = footprint(config, Workload(batch=batch, seq_len=seq_len, training=training, checkpointing=checkpointing))
    params = count_params(config)["total"]
    what = f"{'training ' if training else ''}a model of {params:,} parameters"
    knobs = MODEL_KNOBS
    if batch:
        what += f" on batches of {batch:,} x {seq_len:,} tokens"
        knobs = ("--batch_size, --block_size, --n_layer, --n_embd, --n_inner or --vocab_size" if training
                 else f"the batch size, {knobs}")
    check_fits(need, device, what, knobs)


def check_generation_fits(config: GPTConfig, device: torch.device | str, rows: int, new_tokens: int,
                          prompt_tokens: int = 0) -> None:
    """What decoding `rows` sequences at once holds besides the weights (already loaded): the KV
    cache, a step's scores and their sorted copy, and the ids."""
    need = footprint(config, Workload(rows=rows, new_tokens=new_tokens, prompt_tokens=prompt_tokens), param_bytes=0)
    check_fits(need, device, f"generating {rows:,} sequences at once", "--num-samples or --beams")


def check_batch_fits(config: GPTConfig, device: torch.device | str, batch: int, seq_len: int, what: str, knobs: str,
                     attention_maps: bool = False) -> None:
    """What a forward pass of a (batch, seq_len) batch holds besides the weights (already
    loaded): activations, logits and ids (and every layer's attention weights, for maps)."""
    need = footprint(config, Workload(batch=batch, seq_len=seq_len, attention_maps=attention_maps), param_bytes=0)
    check_fits(need, device, what, knobs)


def check_meta_model_fits(config: GPTConfig, what: str, knobs: str = "n_layer") -> None:
    """A model of `config` on the meta device: no weights, but every block's Python objects."""
    check_fits(Footprint(modules=MODULE_BYTES_PER_LAYER * config.n_layer), "cpu", what, knobs)
