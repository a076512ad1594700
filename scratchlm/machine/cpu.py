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
import time
from pathlib import Path

from scratchlm.envflags import env_switch, stated_clock_ghz

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
    forced = env_switch("SCRATCHLM_CPU_BF16")  # None when unset; a UserError for a value it does not take
    if forced is not None:
        return forced, f"SCRATCHLM_CPU_BF16={os.environ['SCRATCHLM_CPU_BF16'].strip()}"
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
    return env_switch("SCRATCHLM_CPU_BF16") is False and hardware_bf16()


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


def matmul_flops(dtype, sizes: tuple[int, ...] = (512,), bursts: int = 6, burst_s: float = 0.03) -> float:
    """Best FLOP/s of short bursts of n x n matmuls in `dtype`, over each n in `sizes`: the best
    burst is the one least disturbed by other processes, so the figure is the machine's and not the
    moment's (a burst runs at least one matmul, however long it takes). Leaves torch's random state
    as it was."""
    import time

    import torch

    best = 0.0
    for n in sizes:
        with torch.random.fork_rng(devices=[]):
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        a @ b  # warm the kernels up
        for _ in range(bursts):
            reps, start = 0, time.perf_counter()
            while reps == 0 or time.perf_counter() - start < burst_s:
                a @ b
                reps += 1
            best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
    return best


# The peak that MFU divides by on a CPU: an upper bound built from what the chip can issue, never
# a measurement. A measured peak (the best burst of a matmul probe) depends on the moment it was
# taken: probed on a busy machine it came out low and a run then showed MFU over 100%. The bound
# is cores x the highest clock x the most multiply-add FLOPs a core can issue per cycle for the
# dtype, each factor taken at its largest, so no run can reach past it.

CLOCK_CEILING_GHZ = 6.2
"""The fastest any CPU core on sale is clocked (2026); the bound uses it where the operating
system does not say the highest clock (virtual machines often do not)."""


_SYS_CPU = "/sys/devices/system/cpu"
_TURBO_IN_MAX = ("intel_pstate", "intel_cpufreq", "amd-pstate", "amd_pstate")
"""cpufreq drivers whose cpuinfo_max_freq is the highest boost clock; acpi-cpufreq's (older AMD
machines, some VMs) is the highest clock without boost."""


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def max_clock_ghz() -> tuple[float, str]:
    """(the highest clock a core of this CPU may run at, in GHz; where that figure comes from).

    `SCRATCHLM_CPU_MAX_GHZ` states it (for a virtual machine whose host CPU you know); else the
    largest `cpuinfo_max_freq` Linux reports, where that includes boost (a pstate driver, or boost
    off); else CLOCK_CEILING_GHZ."""
    stated = stated_clock_ghz()
    if stated is not None:
        return stated, "SCRATCHLM_CPU_MAX_GHZ"
    root = Path(_SYS_CPU)
    found = []
    for path in root.glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        try:
            found.append(int(_read(path)) / 1e6)  # kHz
        except ValueError:
            continue
    if not found or max(found) <= 0:
        return CLOCK_CEILING_GHZ, "the ceiling: this system does not report its highest clock"
    driver = _read(root / "cpu0" / "cpufreq" / "scaling_driver")
    boost = _read(root / "cpufreq" / "boost")
    if boost not in ("", "0") and not driver.startswith(_TURBO_IN_MAX):
        return CLOCK_CEILING_GHZ, f"the ceiling: {driver or 'this cpufreq driver'}'s highest clock leaves boost out"
    return max(found), "cpufreq"


def flops_per_cycle(dtype: str, flags: frozenset[str] | None = None, x86: bool | None = None) -> tuple[int, str] | None:
    """(the most matmul FLOPs one core can issue per cycle in `dtype`, the unit that does them), or
    None where no bound is known (another architecture; a matrix unit such as Arm's SME).

    Two fused multiply-add pipes per core on x86 (the most any x86 core has): 16 float32 lanes
    each with AVX-512, 8 with AVX2, and without FMA 8 adds and 8 multiplies with AVX, 4 each with
    SSE. AVX512-BF16's dot product does two bfloat16 products per float32 lane, AVX512-FP16 a
    float16 product in each of 32 lanes; AMX's tiles are bounded at 2048 (twice the rate Intel
    documents, so the bound holds for any generation). On aarch64 at most 64 float32 FLOPs
    (four 128-bit pipes, or two 512-bit SVE pipes) and four times that with BF16 or FP16 matrix
    instructions. bfloat16 or float16 without units of its own runs at the float32 rate or slower."""
    flags = cpu_flags() if flags is None else flags
    x86 = is_x86() if x86 is None else x86
    if x86:
        if "avx512f" in flags:
            fp32, unit = 64, "AVX-512 FMA"
        elif "fma" in flags and "avx2" in flags:
            fp32, unit = 32, "AVX2 FMA"
        elif "avx" in flags:
            fp32, unit = 16, "AVX"
        else:
            fp32, unit = 8, "SSE"
        half = {"bfloat16": ("amx_bf16", "avx512_bf16", "AMX-BF16", "AVX512-BF16"),
                "float16": ("amx_fp16", "avx512_fp16", "AMX-FP16", "AVX512-FP16")}.get(dtype)
        if half and half[0] in flags:
            return 2048, half[2]
        if half and half[1] in flags:
            return 128, half[3]
        return fp32, unit
    if platform.machine().lower() in ("aarch64", "arm64"):
        if "sme" in flags:
            return None
        if dtype == "bfloat16" and "bf16" in flags:
            return 256, "Arm BF16"
        if dtype == "float16" and "fphp" in flags:
            return 256, "Arm FP16"
        return 64, "Arm NEON/SVE FMA"
    return None


def peak_flops_bound(dtype: str, threads: int) -> tuple[float, str] | None:
    """(an upper bound on this CPU's matmul FLOP/s in `dtype` with `threads` threads, how it was
    made), or None where flops_per_cycle knows no bound. Threads beyond the cores this process may
    use add nothing."""
    per_cycle = flops_per_cycle(dtype)
    if per_cycle is None:
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    cores = max(1, min(threads, cores))
    ghz, clock_source = max_clock_ghz()
    flops, unit = per_cycle
    return cores * ghz * 1e9 * flops, f"{cores} cores x {ghz:g} GHz ({clock_source}) x {flops} FLOP/cycle ({unit})"


def _best_gb_s(work, moved_bytes: int, passes: int) -> float:
    """GB/s of the fastest of `passes` calls of work(), which moves `moved_bytes`: noise only ever
    slows a pass down. One untimed call first touches every page."""
    work()
    best = 0.0
    for _ in range(passes):
        start = time.perf_counter()
        work()
        best = max(best, moved_bytes / (time.perf_counter() - start))
    return best / 1e9


def read_bandwidth(megabytes: int = 256, passes: int = 4) -> float:
    """Best GB/s of summing a float32 array of `megabytes`, far larger than the caches, with torch's
    threads: the rate a batch-1 decoding step can read its weights at most."""
    import torch

    x = torch.ones(megabytes * 2**20 // 4)
    return _best_gb_s(x.sum, x.numel() * 4, passes)


def copy_bandwidth(megabytes: int = 256, passes: int = 4) -> float:
    """Best GB/s of copying a float32 array of `megabytes` into another, counting the read and the
    write."""
    import torch

    x = torch.ones(megabytes * 2**20 // 4)
    y = torch.empty_like(x)
    return _best_gb_s(lambda: y.copy_(x), 2 * x.numel() * 4, passes)
