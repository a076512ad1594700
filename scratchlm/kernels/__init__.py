"""Small C kernels for a CPU, compiled on first use.

Decoding: a bfloat16 (or float32) matrix-vector product (gemv_bf16.c), one new position of
attention against the KV cache (attend_one.c), and a whole decoding step of a pre-norm GPT in one
call (decode_step.c), the last two built on the first's dot products (bf16_dot.h).

Batch-1 decoding multiplies one row by every weight matrix, so a step costs the time to read the
weights from memory. bfloat16 weights halve that, but the library paths read them well below
the memory's streaming rate for a single row. `gemv_bf16.c` reads each weight row once, in order.
What is left of a step is small operations: attention, norms, activations, residual adds and the
calls between them. `attend_one.c` does a layer's attention in one call
(scratchlm.kernels.decoding_copy.DecodingAttention), and `decode_step.c` the whole step
(scratchlm.kernels.decode_step), so that a step is little more than the reading of its weights.
How much each saved: benchmarks/measurements.md; the rates today: benchmarks/bench_decode.py.

Training in float32: a layer's attention core, RoPE to the heads side by side again, forward and
backward (train_attention.c), and the exact GELU with its derivative (train_gelu.c), both on the
vectors of vec.h; scratchlm.kernels.train_ops wraps them for autograd.

The C files are compiled here into one library, with the system's C compiler (`$CC`, else `cc`
or `gcc`), into `~/.cache/scratchlm/kernels/` (or `$SCRATCHLM_CACHE/kernels/`, or
`$SCRATCHLM_KERNEL_CACHE` where set), once per source,
compiler, CPU and variant, and loaded with ctypes. If there is no compiler, or the build fails, or
SCRATCHLM_NO_KERNELS=1 is set, `cpu_kernels()` returns None and callers use PyTorch's own
operations; `kernel_status()` says which and why (a failed build also prints one line).

The cache is not trusted blindly: loading a library runs its code, and a file cut short under a
mapping kills the process with SIGBUS instead of raising. So the build records what it built
(`NAME.record.json`: size, sha256 and flags of the library, written after the library is in
place, each in one rename), and a library is loaded only when it matches its record
(`verified_flags`). Anything else (a library cut short or replaced, no record, a record that is
not one) is built again; if that build fails, one line says so and PyTorch's operations are used.

Variants (`VARIANTS`): the instruction set the library is compiled for. "native" (the default)
is whatever this CPU has; the others are fixed levels, so every loop of bf16_dot.h can be built
and tested on any CPU that runs it (`runnable_variants()`): SCRATCHLM_KERNEL_VARIANT=x86-64-v3
builds the AVX2 loop on an AVX-512 machine. Flags that a compiler or platform refuses
(-march=native on some aarch64 compilers, -fopenmp on clang without libomp) are dropped in turn
before the build is called failed; a library without OpenMP runs on one thread.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from scratchlm.envflags import env_switch
from scratchlm.fileio import atomic_write, cache_home
from scratchlm.machine import cpu

SOURCE = Path(__file__).with_name("gemv_bf16.c")
SOURCES = [SOURCE, *(Path(__file__).with_name(name) for name in
                     ("attend_one.c", "decode_step.c", "train_attention.c", "train_gelu.c"))]  # one library
HEADERS = [Path(__file__).with_name(name) for name in ("bf16_dot.h", "attention.h", "vec.h", "exp_poly.h")]  # included by the sources: part of the cache key
BASE_FLAGS = ["-O3", "-shared", "-fPIC", "-std=c11"]

GEMV_PARALLEL_MIN = 1 << 16
"""Multiply-adds per row of x (n_out * k) from which gemv splits the output rows between threads:
below it, waking the second thread costs more than it saves."""

def gemv_parallel(n_out: int, k: int) -> bool:
    """Whether gemv shares an (n_out, k) matrix's rows out between threads (GEMV_PARALLEL_MIN)."""
    return n_out * k >= GEMV_PARALLEL_MIN


ATTEND_PARALLEL_MIN = 1 << 17
"""Multiply-adds (B * H * (pos + 1) * hs) from which attend_one splits the (sequence, head)
pairs between threads."""
OPENMP = "-fopenmp"

# name -> the instruction-set flags to try, in order (the first the compiler accepts is used)
VARIANTS: dict[str, list[list[str]]] = {
    "native": [["-march=native"], ["-mcpu=native"], []],  # every extension this CPU has
    "x86-64-v4": [["-march=x86-64-v4"]],  # AVX-512 F/BW/DQ/VL, no BF16: the avx512f loop
    "x86-64-v3": [["-march=x86-64-v3"]],  # AVX2 and FMA: the avx2 loop
    "x86-64-v2": [["-march=x86-64-v2"]],  # SSE4.2: the portable loop, vectorised with SSE
    "scalar": [["-fno-tree-vectorize", "-fno-tree-slp-vectorize"]],  # the portable loop, not vectorised
}
# the CPU flags (as /proc/cpuinfo names them) each fixed x86 level needs
_X86_LEVELS = {
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma"},
    "x86-64-v3": {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"},
    "x86-64-v2": {"sse4_2", "ssse3", "popcnt", "cx16"},
}

_lock = threading.Lock()
_loaded: dict[str, tuple["CpuKernels | None", str]] = {}  # variant -> (kernels or None, reason)
_warned: set[str] = set()


def _cache_dir() -> Path:
    env = os.environ.get("SCRATCHLM_KERNEL_CACHE")
    return Path(env).expanduser() if env else cache_home() / "kernels"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    """What -march=native depends on: the CPU's feature flags (Linux), else the machine name."""
    flags = cpu.cpu_flags()
    return " ".join(sorted(flags)) if flags else platform.machine() + platform.processor()


def selected_variant() -> str:
    """The variant `cpu_kernels()` loads: $SCRATCHLM_KERNEL_VARIANT, else "native"."""
    return os.environ.get("SCRATCHLM_KERNEL_VARIANT", "").strip() or "native"


def runnable_variants() -> list[str]:
    """The variants this CPU can execute, "native" first. Off x86 only "native" and "scalar"."""
    if not cpu.is_x86():
        return ["native", "scalar"]
    flags = cpu.cpu_flags()
    return ["native", *(name for name, need in _X86_LEVELS.items() if need <= flags), "scalar"]


def _isa_candidates(variant: str) -> list[list[str]]:
    candidates = VARIANTS[variant]
    if variant == "native" and cpu.forced_off():  # SCRATCHLM_CPU_BF16=0: build as a CPU without it would
        candidates = [[*flags, "-mno-avx512bf16"] if flags[:1] == ["-march=native"] else flags for flags in candidates]
    if variant == "native" and not cpu.is_x86():  # aarch64 compilers spell it -mcpu=native (some refuse -march)
        candidates = [flags for flags in candidates if flags != ["-march=native"]]
    return candidates


def _target(cc: str, variant: str) -> tuple[Path, list[list[str]]]:
    """Where the library for this source, compiler, CPU and variant lives in the cache, and the
    flag sets to try in turn when building it."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = [path.read_text() for path in SOURCES + HEADERS]
    candidates = [[*BASE_FLAGS, *isa, *omp] for isa in _isa_candidates(variant) for omp in ([OPENMP], [])]
    key = hashlib.sha256("\0".join([*texts, repr(candidates), version, _cpu_flags()]).encode())
    return _cache_dir() / f"scratchlm-kernels-{variant}-{key.hexdigest()[:16]}.so", candidates


def _record_path(library: Path) -> Path:
    return library.with_suffix(".record.json")


def _digest(path: Path) -> tuple[int, str]:
    """(size, sha256) of the file at `path`, read once."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def verified_flags(library: Path) -> list[str] | None:
    """The flags `library` was built with, if it is exactly what the build recorded: the record
    (written last, after the library was in place) names its size and sha256. None for anything
    else: no library, no record, a record that is not one, a library cut short or replaced. A
    library is loaded only after this says yes, since loading runs its code and a file cut short
    under a mapping dies of SIGBUS rather than an error."""
    try:
        record = json.loads(_record_path(library).read_bytes())
        size, sha = _digest(library)
    except (OSError, ValueError):  # missing, unreadable, not UTF-8 JSON
        return None
    if not (isinstance(record, dict) and record.get("size") == size and record.get("sha256") == sha
            and isinstance(record.get("flags"), list) and all(isinstance(f, str) for f in record["flags"])):
        return None
    return record["flags"]


def _build(cc: str, variant: str = "native") -> tuple[Path, list[str]]:
    """The library for `variant`: the cached one if it matches its record (verified_flags), else
    compiled again into the cache. The library appears in one rename, then its record, so a
    library without a record, or not matching it, is one whose build did not finish."""
    target, candidates = _target(cc, variant)
    flags = verified_flags(target)
    if flags is not None:
        return target, flags
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    last_error = f"{cc} failed"
    try:
        for flags in candidates:
            done = subprocess.run([cc, *flags, "-o", tmp, *map(str, SOURCES), "-lm"], capture_output=True,
                                  text=True, timeout=300)
            if done.returncode == 0:
                size, sha = _digest(Path(tmp))
                os.replace(tmp, target)  # a new file, never the old one rewritten: a process using it keeps it
                with atomic_write(_record_path(target), "w") as f:
                    json.dump({"size": size, "sha256": sha, "flags": flags, "variant": variant}, f)
                if verified_flags(target) != flags:  # another process's build replaced ours meanwhile
                    raise RuntimeError(f"{target} changed while it was written")
                return target, flags
            if done.stderr.strip():
                last_error = done.stderr.strip().splitlines()[-1]
        raise RuntimeError(last_error)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_GEMV = [_P] * 4 + [_I64] * 3 + [_INT]  # weight, x, bias, y; m, n_out, k; parallel
_STEP = [_P, _P, *[_I64] * 3, *[_P] * 3, _INT, _P, _I64]  # model, ids; B, T, pos; k, v, logits; threads; scratch

# Every function of the library: C name -> (result type, argument types), each argument's meaning
# in its C file. CpuKernels sets these on the library once, so that a call passes exactly these.
SIGNATURES: dict[str, tuple[type | None, list[type]]] = {
    # gemv_bf16.c: y = x W^T + b
    "scratchlm_gemv_bf16": (_INT, _GEMV),
    "scratchlm_gemv_f32": (_INT, _GEMV),
    "scratchlm_gemv_f32_owners": (_INT, [*_GEMV, _P]),  # and which thread took each row: for tests
    "scratchlm_gemv_max_rows": (_INT, []),
    "scratchlm_gemv_uses_dpbf16": (_INT, []),
    "scratchlm_kernel_path": (ctypes.c_char_p, []),
    "scratchlm_kernel_rounds_input": (_INT, []),
    # attend_one.c: qkv, k_cache, v_cache, out; B, H, hs, t_max, pos; parallel
    "scratchlm_attend_one": (_INT, [*[_P] * 4, *[_I64] * 5, _INT]),
    # decode_step.c, called by decode_step.FusedDecodeStep
    "scratchlm_decode_scratch_bytes": (_I64, [_P, _I64]),  # model, threads
    "scratchlm_decode_step": (_INT, _STEP),
    "scratchlm_decode_step_counted": (_INT, [*_STEP, _P]),  # and the rows each thread computed: for tests
    "scratchlm_decode_greedy": (_INT, [_P, _P, *[_I64] * 3, *[_P] * 4, _INT, _P, _I64]),  # ... logits, out; ...
    # train_attention.c and train_gelu.c, called by train_ops
    "scratchlm_train_attention_forward": (_INT, [*[_P] * 5, *[_I64] * 4, _INT]),
    "scratchlm_train_attention_backward": (_INT, [*[_P] * 6, *[_I64] * 4, _INT]),
    "scratchlm_train_attention_max_t": (_I64, []),
    "scratchlm_train_attention_max_hs": (_I64, []),
    "scratchlm_train_attention_hs_multiple": (_I64, []),
    "scratchlm_train_attention_row_stride": (_I64, [_I64]),  # (T) -> floats a row of weights takes
    "scratchlm_gelu_forward": (_INT, [*[_P] * 3, _I64, _INT]),
}


class CpuKernels:
    """The loaded library. `__call__(x, weight, bias)` is F.linear(x, weight, bias) for x of at
    most `max_rows` rows (float32), weight (out, in) bfloat16 or float32, bias float32 or None; the
    result is float32, the products summed in float32. `attend_one` is a decoding step's attention.
    `lib` is the library itself, its functions declared as SIGNATURES says."""

    def __init__(self, lib: ctypes.CDLL, path: Path, variant: str = "native", flags: list[str] | None = None):
        self.path = path
        self.variant = variant
        self.flags = list(flags or [])
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(lib, name)  # ctypes keeps the one object per name, with what is set here
            fn.restype, fn.argtypes = restype, argtypes
        self.lib = lib
        self.max_rows = lib.scratchlm_gemv_max_rows()
        self.uses_dpbf16 = bool(lib.scratchlm_gemv_uses_dpbf16())
        self.loop = lib.scratchlm_kernel_path().decode()  # which loop of bf16_dot.h: "avx512-bf16", "avx512f", ...
        # True where a bfloat16 product rounds its float32 input to bfloat16 first (bf16_dot.h)
        self.rounds_input = bool(lib.scratchlm_kernel_rounds_input())
        self.attention_max_t = lib.scratchlm_train_attention_max_t()
        self.attention_max_hs = lib.scratchlm_train_attention_max_hs()
        self.attention_hs_multiple = lib.scratchlm_train_attention_hs_multiple()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        n_out, k = weight.shape
        lead = x.shape[:-1]
        m = x.numel() // k if x.shape[-1] == k else 0
        if not (1 <= m <= self.max_rows):
            raise ValueError(f"gemv_bf16: x of shape {tuple(x.shape)} does not fit weight {tuple(weight.shape)} "
                             f"with at most {self.max_rows} rows")
        if weight.dtype not in (torch.bfloat16, torch.float32) or not weight.is_contiguous() \
                or weight.device.type != "cpu":
            raise ValueError("gemv_bf16: weight must be a contiguous bfloat16 or float32 CPU tensor")
        x2 = x.reshape(m, k).to(torch.float32).contiguous()
        if bias is not None:
            bias = bias.to(torch.float32).contiguous()
            if bias.shape != (n_out,):
                raise ValueError(f"gemv_bf16: bias of shape {tuple(bias.shape)} for {n_out} outputs")
        return self.rows(x2, weight, bias, m).view(*lead, n_out)

    def rows(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, m: int) -> torch.Tensor:
        """`__call__` without its checks, for a caller that made them once (a decoding step makes
        about 50 calls, and each check costs as much as the call itself): x float32, contiguous,
        m rows of weight.shape[1]; weight and bias as for `__call__`. Returns (m, out) float32."""
        n_out, k = weight.shape
        y = torch.empty(m, n_out)
        parallel = gemv_parallel(n_out, k)
        fn = self.lib.scratchlm_gemv_bf16 if weight.dtype == torch.bfloat16 else self.lib.scratchlm_gemv_f32
        rc = fn(weight.data_ptr(), x.data_ptr(), 0 if bias is None else bias.data_ptr(), y.data_ptr(),
                m, n_out, k, parallel)
        if rc != 0:
            raise MemoryError("gemv_bf16: out of memory")
        return y

    def row_owners(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Which thread computed each output row of x @ weight^T (float32 weight (n_out, k), x (m, k)
        float32 contiguous), split as `rows` splits it: (n_out,) int32 thread numbers. For tests."""
        n_out, k = weight.shape
        y = torch.empty(x.shape[0], n_out)
        owner = torch.full((n_out,), -1, dtype=torch.int32)
        if self.lib.scratchlm_gemv_f32_owners(weight.data_ptr(), x.data_ptr(), 0, y.data_ptr(), x.shape[0], n_out, k,
                        gemv_parallel(n_out, k), owner.data_ptr()) != 0:
            raise MemoryError("gemv: out of memory")
        return owner

    def attend_one(self, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int,
                   n_head: int) -> torch.Tensor:
        """One new position of attention (scratchlm/kernels/attend_one.c): writes its key and value
        into k_cache, v_cache (B, H, t_max, hs) at `pos` and returns softmax(q k^T / sqrt(hs)) v over
        positions 0..pos for every head, side by side: qkv (B, 1, 3C) -> (B, 1, C). All float32."""
        B, _, three_c = qkv.shape
        C = three_c // 3
        _, H, t_max, hs = k_cache.shape
        if (qkv.shape[1] != 1 or H != n_head or H * hs != C or not 0 <= pos < t_max
                or any(t.dtype != torch.float32 or not t.is_contiguous() for t in (qkv, k_cache, v_cache))
                or v_cache.shape != k_cache.shape or k_cache.shape[0] != B):
            raise ValueError("attend_one: expects float32 contiguous qkv (B, 1, 3C) and caches (B, H, t_max, C/H)")
        out = torch.empty(B, 1, C)
        parallel = B * H * (pos + 1) * hs >= ATTEND_PARALLEL_MIN
        if self.lib.scratchlm_attend_one(qkv.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                        B, H, hs, t_max, pos, parallel) != 0:
            raise MemoryError("attend_one: out of memory")
        return out


def cpu_kernels() -> CpuKernels | None:
    """The compiled kernels of the selected variant, or None where they cannot be had (see
    `kernel_status`). Built once per machine (about a second), loaded once per process."""
    return load_variant(selected_variant())


def load_variant(variant: str) -> CpuKernels | None:
    """The kernels compiled for `variant` (a key of VARIANTS), or None (the reason in
    `kernel_status(variant)`); a failed build prints one line on stderr, once."""
    with _lock:
        if variant not in _loaded:
            _loaded[variant] = _load(variant)
            kernel, reason = _loaded[variant]
            if kernel is None and reason.startswith(("build failed", "unknown", "not runnable")) \
                    and variant not in _warned:
                _warned.add(variant)
                print(f"scratchlm: compiled kernels not used: {reason} (`scratchlm doctor` says more)",
                      file=sys.stderr)
        return _loaded[variant][0]


def kernel_status(variant: str | None = None) -> str:
    """One line: whether the compiled kernels are in use (variant, decoding loop, rounding), or why not."""
    variant = variant or selected_variant()
    kernel = load_variant(variant)
    reason = _loaded[variant][1]
    if kernel is None:
        return reason
    rounding = "rounds x to bfloat16" if kernel.rounds_input else "x stays float32"
    return f"compiled ({variant}: {kernel.loop} loop, {rounding}): {kernel.path}"


def _load(variant: str) -> tuple[CpuKernels | None, str]:
    if env_switch("SCRATCHLM_NO_KERNELS"):  # 1/true/yes/on; 0/false/no/off or unset leave them on
        return None, "off (SCRATCHLM_NO_KERNELS is set): PyTorch's operations"
    if variant not in VARIANTS:
        return None, f"unknown variant {variant!r} (SCRATCHLM_KERNEL_VARIANT; one of {', '.join(VARIANTS)}): PyTorch's operations"
    if sys.platform != "linux":
        return None, f"not built on {sys.platform} (Linux only): PyTorch's operations"
    if variant not in runnable_variants():
        return None, f"not runnable: this CPU cannot execute variant {variant!r} (it can: {', '.join(runnable_variants())}): PyTorch's operations"
    cc = compiler()
    if cc is None:
        return None, "no C compiler found (set CC): PyTorch's operations"
    try:
        path, flags = _build(cc, variant)  # verified against its record, else built again
        return CpuKernels(ctypes.CDLL(str(path)), path, variant, flags), "compiled"
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"build failed ({e}): PyTorch's operations"
    except AttributeError as e:  # the build's own output, yet a function is missing: a bug, said in one line
        return None, f"build failed (the library lacks {e}): PyTorch's operations"
