"""Small C kernels for decoding on a CPU, compiled on first use: a bfloat16 (or float32)
matrix-vector product (gemv_bf16.c), one new position of attention against the KV cache (attend_one.c), and a whole
decoding step of a pre-norm GPT in one call (decode_step.c), the last two built on the first's dot
products (bf16_dot.h).

Batch-1 decoding multiplies one row by every weight matrix, so a step costs the time to read the
weights from memory. bfloat16 weights halve that, but the library paths read them slowly out of
cache: oneDNN's packed bfloat16 matmul reaches about 12 GB/s on one core of the benchmark machine,
where a plain streaming read reaches about 27 (see benchmarks/bench_decode.py). `gemv_bf16.c` reads
each weight row once, in order, and reaches about 20. What is left of a step is small operations:
attention, norms, activations, residual adds and the calls between them. `attend_one.c` does a
layer's attention in one call (scratchlm.generate.DecodingAttention, about 1 ms less per
GPT-2-small token), and `decode_step.c` the whole step (scratchlm.kernels.decode_step, about
1.5 ms less again), so that a step is little more than the reading of its weights.

The C files are compiled here into one library, with the system's C compiler (`$CC`, else `cc`
or `gcc`), into `~/.cache/scratchlm/kernels/` (or `$SCRATCHLM_CACHE/kernels/`), once per source,
compiler and CPU, and loaded with ctypes. If there is no compiler, or the build fails, or SCRATCHLM_NO_KERNELS=1 is
set, `cpu_kernels()` returns None and callers use PyTorch's own operations; `kernel_status()`
says which and why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("gemv_bf16.c")
SOURCES = [SOURCE, Path(__file__).with_name("attend_one.c"), Path(__file__).with_name("decode_step.c")]  # one library
HEADERS = [Path(__file__).with_name("bf16_dot.h"), Path(__file__).with_name("attention.h")]  # included by the sources: part of the cache key
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "kernel": CpuKernels | None, "reason": str


def _cache_dir() -> Path:
    from scratchlm.data import cache_home  # the one reading of $SCRATCHLM_CACHE; only at build time

    return cache_home() / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    """What -march=native depends on: the CPU's feature flags (Linux), else the machine name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def _build(cc: str) -> Path:
    """Compile SOURCES into one library in the cache (atomically: a finished library or none) and
    return its path."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = [path.read_text() for path in SOURCES + HEADERS]
    key = hashlib.sha256("\0".join([*texts, " ".join(FLAGS), version, _cpu_flags()]).encode())
    target = _cache_dir() / f"scratchlm-kernels-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, "-o", tmp, *map(str, SOURCES), "-lm"], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"{cc} failed")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class CpuKernels:
    """The loaded library. `__call__(x, weight, bias)` is F.linear(x, weight, bias) for x of at
    most `max_rows` rows (float32), weight (out, in) bfloat16 or float32, bias float32 or None; the
    result is float32, the products summed in float32. `attend_one` is a decoding step's attention."""

    def __init__(self, lib: ctypes.CDLL, path: Path):
        self.path = path
        self._fn = lib.scratchlm_gemv_bf16
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        self._fn_f32 = lib.scratchlm_gemv_f32
        self._fn_f32.restype = ctypes.c_int
        self._fn_f32.argtypes = self._fn.argtypes
        self.max_rows = lib.scratchlm_gemv_max_rows()
        self.uses_dpbf16 = bool(lib.scratchlm_gemv_uses_dpbf16())
        self._attend = lib.scratchlm_attend_one
        self._attend.restype = ctypes.c_int
        self._attend.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5 + [ctypes.c_int]
        self.step_fn = lib.scratchlm_decode_step  # called by decode_step.FusedDecodeStep
        self.step_fn.restype = ctypes.c_int
        self.step_fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int]
        self.greedy_fn = lib.scratchlm_decode_greedy  # several greedy steps: decode_step.FusedDecodeStep.greedy
        self.greedy_fn.restype = ctypes.c_int
        self.greedy_fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int]

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
        parallel = n_out * k >= 1 << 16  # below that, starting the second thread costs more than it saves
        fn = self._fn if weight.dtype == torch.bfloat16 else self._fn_f32
        rc = fn(weight.data_ptr(), x.data_ptr(), 0 if bias is None else bias.data_ptr(), y.data_ptr(),
                m, n_out, k, parallel)
        if rc != 0:
            raise MemoryError("gemv_bf16: out of memory")
        return y

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
        parallel = B * H * (pos + 1) * hs >= 1 << 17
        if self._attend(qkv.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                        B, H, hs, t_max, pos, parallel) != 0:
            raise MemoryError("attend_one: out of memory")
        return out


def cpu_kernels() -> CpuKernels | None:
    """The compiled kernels, or None where they cannot be had (see `kernel_status`). Built once
    per machine (about half a second), loaded once per process."""
    with _lock:
        if "kernel" not in _state:
            _state["kernel"], _state["reason"] = _load()
        return _state["kernel"]  # type: ignore[return-value]


def kernel_status() -> str:
    """One line: whether the decoding kernels are in use (and which gemv loop), or why not."""
    kernel = cpu_kernels()
    return str(_state["reason"]) if kernel is None else \
        f"compiled ({'AVX512-BF16' if kernel.uses_dpbf16 else 'portable C'}): {kernel.path}"


def _load() -> tuple[CpuKernels | None, str]:
    if os.environ.get("SCRATCHLM_NO_KERNELS", "") not in ("", "0"):
        return None, "off (SCRATCHLM_NO_KERNELS is set): PyTorch's matmul"
    if sys.platform != "linux":
        return None, f"not built on {sys.platform} (Linux only): PyTorch's matmul"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set CC): PyTorch's matmul"
    try:
        path = _build(cc)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:  # a damaged file in the cache (a full disk, a copy cut short): build it again, once
            path.unlink(missing_ok=True)
            path = _build(cc)
            lib = ctypes.CDLL(str(path))
        return CpuKernels(lib, path), "compiled"
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"build failed ({e}): PyTorch's matmul"
