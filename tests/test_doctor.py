"""`scratchlm doctor`: the facts it prints against readings made here (the kernel of the OS, the
compiler, the environment switches)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path



def _doctor(cache: Path | None, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The command in a fresh process; `cache` a fresh cache folder, or None for the user's (where
    the kernels are already built)."""
    switches = ("SCRATCHLM_NO_KERNELS", "SCRATCHLM_KERNEL_VARIANT", "SCRATCHLM_CPU_BF16", "ONEDNN_MAX_CPU_ISA")
    inherited = {k: v for k, v in os.environ.items() if k not in switches}  # a CI pass may set them
    full = {**inherited, **env, **({"SCRATCHLM_CACHE": str(cache)} if cache else {})}
    return subprocess.run([sys.executable, "-m", "scratchlm", "doctor", *args], capture_output=True, text=True,
                          env=full, timeout=120)


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def test_doctor_prints_the_machine():
    done = _doctor(None)  # how long it takes is the benchmarks' business, not a test's
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for label in ("cpu", "flags", "bfloat16", "kernels", "compiler", "torch", "measured", "CJK font"):
        assert any(line.startswith(label) for line in lines), label
    measured = next(line for line in lines if line.startswith("measured"))
    assert "GFLOP/s" in measured and "GB/s" in measured


def test_doctor_facts_agree_with_the_operating_system():
    done = _doctor(None, "--json", "--no-measure")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    flags = _cpuinfo_flags()
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    hardware_bf16 = bool({"avx512_bf16", "amx_bf16"} & flags) if x86 else "bf16" in flags
    assert facts["bf16_native"] == hardware_bf16
    assert facts["dtype_auto_train"] == ("bfloat16" if hardware_bf16 else "float32")
    assert facts["muon_newton_schulz"] == ("bfloat16" if hardware_bf16 else "float32")
    assert set(facts["flags"]) <= flags
    assert facts["torch_threads"] >= 1 and "read_gb_s" not in facts
    if facts["kernel_loop"] is not None and x86:
        assert (facts["kernel_loop"] == "avx512-bf16") == ("avx512_bf16" in flags)


def test_doctor_follows_the_switches(tmp_path):
    """SCRATCHLM_CPU_BF16=0 (a CPU without bfloat16 units), a failing compiler, and no kernels."""
    facts = json.loads(_doctor(None, "--json", "--no-measure", SCRATCHLM_CPU_BF16="0").stdout)
    assert not facts["bf16_native"] and facts["bf16_why"] == "SCRATCHLM_CPU_BF16=0"
    assert facts["dtype_auto_train"] == "float32" and facts["muon_newton_schulz"] == "float32"
    assert facts["kernel_loop"] != "avx512-bf16"
    done = _doctor(tmp_path / "cache", "--no-measure", CC="false")
    assert done.returncode == 0
    kernels_line = next(line for line in done.stdout.splitlines() if line.startswith("kernels"))
    assert "build failed" in kernels_line
    facts = json.loads(_doctor(None, "--json", "--no-measure", SCRATCHLM_NO_KERNELS="1").stdout)
    assert facts["kernel_loop"] is None and facts["kernel_status"].startswith("off (SCRATCHLM_NO_KERNELS")


def test_doctor_says_how_to_get_a_cjk_font_when_there_is_none(monkeypatch, capsys):
    from scratchlm.cli import doctor
    from scratchlm.cli.main import main

    monkeypatch.setattr(doctor, "_cjk_font", lambda: None)
    assert main(["doctor", "--no-measure"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("CJK font"))
    assert "fonts-noto-cjk" in line
    monkeypatch.setattr(doctor, "_cjk_font", lambda: "Noto Sans CJK SC")
    assert main(["doctor", "--no-measure"]) == 0
    assert "CJK font     Noto Sans CJK SC" in capsys.readouterr().out
