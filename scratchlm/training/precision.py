"""A run's compute precision: which dtype it trains in (`auto` asks the device what it multiplies
natively), and the autocast context that runs a forward pass in it."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from scratchlm.errors import UserError
from scratchlm.machine.cpu import auto_dtype


def choose_dtype(requested: str, device: torch.device) -> str:
    """The dtype a run on `device` computes in: `requested`, or for `auto` what the device
    multiplies natively; float16 only where a gradient scaler can run (CUDA)."""
    dtype = auto_dtype(device) if requested == "auto" else requested
    if dtype == "float16" and device.type != "cuda":
        raise UserError("--dtype float16 needs a CUDA device (gradient scaling); use bfloat16 on CPU")
    return dtype


def autocast(device: torch.device, dtype: str):
    """The context a forward pass runs in: float32 as it is, bfloat16 and float16 under torch.autocast."""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))
