"""Sizes checked before memory is touched: what a model, its training state or a generation will
need, against what the device has free, so a size typed with one zero too many is one clear error
naming the knob, not an allocation failure deep inside torch (or the machine swapping to a halt)."""

from __future__ import annotations

import os

import torch

from scratchlm.config import GPTConfig
from scratchlm.errors import UserError
from scratchlm.flops import count_params

TRAINING_BYTES_PER_PARAM = 16
"""float32 weights, their gradients and AdamW's two moments: 4 + 4 + 8 bytes."""


def available_bytes(device: torch.device | str) -> int | None:
    """Memory free for new allocations on `device` (None where it cannot be told)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def check_fits(need: int, device: torch.device | str, what: str, knobs: str) -> None:
    """One clear error when `need` bytes exceed what `device` has free."""
    free = available_bytes(device)
    if free is not None and need > free:
        raise UserError(f"{what} needs about {human_bytes(need)}, but {torch.device(device)} has "
                        f"{human_bytes(free)} free; lower {knobs}")


def check_model_fits(config: GPTConfig, device: torch.device | str, training: bool = False) -> None:
    """The model's parameters (with gradients and optimizer state when training), in float32."""
    params = count_params(config)["total"]
    per_param = TRAINING_BYTES_PER_PARAM if training else 4
    what = f"{'training ' if training else ''}a model of {params:,} parameters"
    check_fits(params * per_param, device, what, "vocab_size, n_embd, n_layer or n_inner")


def check_generation_fits(config: GPTConfig, device: torch.device | str, rows: int, new_tokens: int,
                          prompt_tokens: int = 0) -> None:
    """What decoding `rows` sequences at once holds besides the weights: the KV cache (float32,
    every layer, the whole context), a step's scores and their sorted copy, and the ids."""
    cache = 2 * config.n_layer * rows * config.block_size * config.n_embd * 4
    scores = 3 * rows * config.vocab_size * 4
    ids = rows * (prompt_tokens + new_tokens) * 8
    check_fits(cache + scores + ids, device, f"generating {rows:,} sequences at once", "--num-samples or --beams")
