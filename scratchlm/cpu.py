"""What this CPU does natively, read once from the operating system: its name, its feature
flags, and whether bfloat16 arithmetic is native (AVX512-BF16 or AMX on x86, the BF16 extension
on aarch64) or emulated in float32.

Defaults follow this, not the machine a figure was measured on: `--dtype auto` picks bfloat16
only where it is native, and Muon orthogonalises in float32 where it is not (on such a CPU a
bfloat16 matmul is emulated and slower than a float32 one).

`SCRATCHLM_CPU_BF16=0` makes a CPU that has native bfloat16 behave as one without it
(`native_bf16()` is False, and the decoding kernels' "native" build leaves AVX512-BF16 out), so
the fallback paths can be run and measured anywhere; `=1` claims it. oneDNN has its own switch,
`ONEDNN_MAX_CPU_ISA` (for example AVX512_CORE_VNNI): below a bfloat16 level it makes torch's
bfloat16 matmuls emulated too, and `native_bf16()` reads it as well.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

_ONEDNN_BF16_LEVELS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10", "ALL", "DEFAULT")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what platform knows."""
    for line in _cpuinfo().splitlines():
        if line.startswith(("model name", "Model name")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them ("flags" on x86, "Features" on aarch64); empty
    where they cannot be read."""
    for line in _cpuinfo().splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def hardware_bf16() -> bool:
    """Whether the CPU itself has bfloat16 arithmetic, whatever the environment says."""
    flags = cpu_flags()
    if is_x86():
        return bool({"avx512_bf16", "amx_bf16"} & flags)
    return "bf16" in flags  # aarch64: FEAT_BF16 (BFDOT, BFMMLA)


def native_bf16() -> bool:
    """Whether bfloat16 matmuls are native here: the hardware has them and neither
    SCRATCHLM_CPU_BF16=0 nor an ONEDNN_MAX_CPU_ISA below bfloat16 switches them off."""
    return bf16_reason()[0]


def bf16_reason() -> tuple[bool, str]:
    """(native_bf16(), why), the why in a few words for `scratchlm doctor` and the logs."""
    forced = os.environ.get("SCRATCHLM_CPU_BF16", "")
    if forced in ("0", "1"):
        return forced == "1", f"SCRATCHLM_CPU_BF16={forced}"
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if isa and is_x86() and not isa.startswith(_ONEDNN_BF16_LEVELS):
        return False, f"ONEDNN_MAX_CPU_ISA={isa} (below bfloat16)"
    if hardware_bf16():
        return True, "avx512_bf16" if "avx512_bf16" in cpu_flags() else ("amx_bf16" if is_x86() else "bf16")
    if not cpu_flags():
        return False, "CPU flags unreadable: assumed emulated"
    return False, "no AVX512-BF16 or AMX" if is_x86() else "no BF16 extension"


def forced_off() -> bool:
    """True when SCRATCHLM_CPU_BF16=0 hides a bfloat16 unit the hardware has."""
    return os.environ.get("SCRATCHLM_CPU_BF16", "") == "0" and hardware_bf16()


def auto_dtype(device) -> str:
    """What `--dtype auto` trains in on `device`: bfloat16 where its matmuls are native (a CUDA
    GPU that supports it; a CPU with bfloat16 units, `native_bf16`), else float32. On a CPU
    without them bfloat16 is emulated and slower than float32."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type == "cpu" and native_bf16():
        return "bfloat16"
    return "float32"


def matmul_flops(dtype, n: int = 512, bursts: int = 6, burst_s: float = 0.03) -> float:
    """Best FLOP/s of short bursts of n x n matmuls in `dtype`: the best burst is the one least
    disturbed by other processes, so the figure is the machine's and not the moment's. Leaves
    torch's random state as it was."""
    import time

    import torch

    with torch.random.fork_rng(devices=[]):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm the kernels up
    best = 0.0
    for _ in range(bursts):
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < burst_s:
            a @ b
            reps += 1
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
    return best
