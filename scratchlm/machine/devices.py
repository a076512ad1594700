"""`--device`: one reading of the flag for every command."""

from __future__ import annotations

import torch

from scratchlm.errors import UserError


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def pick_device(name: str, *, allow_mps: bool = True) -> torch.device:
    """The torch device `--device name` means: `auto` is cuda, then mps (where allowed), then cpu;
    anything else must be a device torch knows and this machine has, or it is one clear error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if allow_mps and _mps_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"--device {name}: not a device torch knows; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA device is available here; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                            f"numbered from 0")
    elif device.type == "mps":
        if not _mps_available():
            raise UserError(f"--device {name}: Apple's MPS is not available here; use --device cpu")
    elif device.type != "cpu":
        raise UserError(f"--device {name}: scratchlm runs on cpu, cuda or mps, not {device.type}")
    return device
