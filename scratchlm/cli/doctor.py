"""`scratchlm doctor`: what this machine gives scratchlm, in a few seconds.

The CPU and the flags that decide the fast paths, whether bfloat16 is native (and so what
`--dtype auto` and Muon choose), which decoding-kernel variant is built and why (or why none),
torch's threads, measured float32 and bfloat16 matmul rates and memory read bandwidth, the C
compiler, and whether a CJK font is there for the attention pictures. `facts()` is also what
`python -m benchmarks` records beside its figures. The probes themselves (matmul rates, memory
bandwidth) are scratchlm.machine.cpu's.
"""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any

import torch

from scratchlm.machine import cpu
from scratchlm.machine.cpu import read_bandwidth

# the flags that change a code path here, in the order they matter
_FLAGS = ["avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma",
          "sse4_2", "asimd", "bf16", "sve", "i8mm"]
_CJK_SAMPLE = "中文注意力"


def _compiler_line() -> str:
    from scratchlm import kernels
    cc = kernels.compiler()
    if cc is None:
        return "none found (set CC; decoding and training then use PyTorch's operations)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{cc} ({version.splitlines()[0].strip() if version.strip() else 'version unknown'})"


def _cjk_font() -> str | None:
    try:
        from scratchlm.inside.attention_maps import find_font_for

        return find_font_for(_CJK_SAMPLE)
    except Exception:  # noqa: BLE001 - a broken matplotlib install is reported as no font
        return None


def facts(measure: bool = True) -> dict[str, Any]:
    """Everything `scratchlm doctor` prints, as a dict (JSON-ready). measure=False skips the
    timed probes (about 3 s)."""
    from scratchlm import kernels
    from scratchlm.kernels.decoding_copy import auto_decoding_dtype, mkldnn_packing_available
    from scratchlm.training.optim import newton_schulz_dtype

    native, why = cpu.bf16_reason()
    flags = cpu.cpu_flags()
    loaded = kernels.cpu_kernels()
    out: dict[str, Any] = {
        "cpu": cpu.cpu_name(), "machine": platform.machine(), "cores": os.cpu_count(),
        "flags": [f for f in _FLAGS if f in flags],
        "bf16_native": native, "bf16_why": why,
        "dtype_auto_train": cpu.auto_dtype("cpu"), "dtype_auto_decode": str(auto_decoding_dtype(torch.device("cpu"))).replace("torch.", ""),
        "muon_newton_schulz": str(newton_schulz_dtype(torch.device("cpu"))).replace("torch.", ""),
        "kernel_variant": kernels.selected_variant(), "kernel_status": kernels.kernel_status(),
        "kernel_loop": loaded.loop if loaded else None, "kernel_flags": loaded.flags if loaded else None,
        "kernel_variants_runnable": kernels.runnable_variants(),
        "onednn_bf16_packing": mkldnn_packing_available(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "compiler": _compiler_line(), "cjk_font": _cjk_font(),
    }
    if measure:
        out["matmul_gflops_float32"] = round(cpu.matmul_flops(torch.float32) / 1e9, 1)
        out["matmul_gflops_bfloat16"] = round(cpu.matmul_flops(torch.bfloat16) / 1e9, 1)
        out["read_gb_s"] = round(read_bandwidth(), 1)
    return out


def report(f: dict[str, Any]) -> list[str]:
    """The facts as lines for a person."""
    lines = [
        f"cpu          {f['cpu']} ({f['machine']}, {f['cores']} cores)",
        f"flags        {' '.join(f['flags']) or '(none of the ones that matter)'}",
        f"bfloat16     {'native' if f['bf16_native'] else 'emulated'} ({f['bf16_why']}): --dtype auto trains in "
        f"{f['dtype_auto_train']}, decodes in {f['dtype_auto_decode']}; Muon orthogonalises in {f['muon_newton_schulz']}",
        f"kernels      {f['kernel_status']}",
        f"             variant {f['kernel_variant']} (SCRATCHLM_KERNEL_VARIANT); this CPU runs: "
        f"{', '.join(f['kernel_variants_runnable'])}",
        f"oneDNN bf16  {'packs bfloat16 weights' if f['onednn_bf16_packing'] else 'no bfloat16 packing on this CPU'}",
        f"compiler     {f['compiler']}",
        f"torch        {f['torch']}, {f['torch_threads']} threads" + (f", CUDA: {f['cuda']}" if f["cuda"] else ", no CUDA"),
    ]
    if "read_gb_s" in f:
        ratio = f["matmul_gflops_bfloat16"] / max(f["matmul_gflops_float32"], 1e-9)
        lines.append(f"measured     matmul float32 {f['matmul_gflops_float32']:.0f} GFLOP/s, bfloat16 "
                     f"{f['matmul_gflops_bfloat16']:.0f} GFLOP/s ({ratio:.2f}x); memory read {f['read_gb_s']:.1f} GB/s")
    if f["cjk_font"]:
        lines.append(f"CJK font     {f['cjk_font']} (Chinese labels in attention pictures render)")
    else:
        lines.append("CJK font     none: Chinese labels in attention pictures show as boxes; install one, e.g. "
                     "`apt-get install fonts-noto-cjk` (Debian, Ubuntu) or `dnf install google-noto-sans-cjk-fonts`")
    return lines
