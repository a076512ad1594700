"""MFU's denominator on a CPU (scratchlm.machine.cpu.peak_flops_bound, scratchlm.machine.flops.device_peak): an
upper bound made of cores x highest clock x FLOPs per cycle, checked against products worked out
by hand for made-up CPUs, and against a real matmul on this one (which must stay below it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from scratchlm.errors import UserError
from scratchlm.machine import cpu
from scratchlm.machine.flops import device_peak

AVX512_BF16 = frozenset({"sse", "avx", "fma", "avx2", "avx512f", "avx512_bf16"})


@pytest.mark.parametrize("flags, dtype, expected", [
    (AVX512_BF16, "float32", 2 * 16 * 2),         # two FMA pipes x 16 float32 lanes x (mul + add)
    (AVX512_BF16, "bfloat16", 2 * 16 * 2 * 2),    # the dot product: two bf16 products per lane
    (AVX512_BF16 | {"amx_bf16"}, "bfloat16", 2048),
    (AVX512_BF16, "float16", 2 * 16 * 2),         # no AVX512-FP16: float32's rate
    (AVX512_BF16 | {"avx512_fp16"}, "float16", 2 * 32 * 2),
    (frozenset({"sse", "avx", "fma", "avx2"}), "bfloat16", 2 * 8 * 2),  # emulated: float32's rate
    (frozenset({"sse", "avx"}), "float32", 8 + 8),  # no FMA: 8 adds and 8 multiplies
    (frozenset({"sse", "sse2"}), "float32", 4 + 4),
])
def test_flops_per_cycle_on_x86_cpus(flags, dtype, expected):
    assert cpu.flops_per_cycle(dtype, flags, x86=True)[0] == expected


def test_the_bound_multiplies_cores_clock_and_flops_per_cycle(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: AVX512_BF16)
    monkeypatch.setattr(cpu, "is_x86", lambda: True)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setenv("SCRATCHLM_CPU_MAX_GHZ", "3.5")
    flops, how = cpu.peak_flops_bound("bfloat16", threads=2)
    assert flops == pytest.approx(2 * 3.5e9 * 128)
    assert how == "2 cores x 3.5 GHz (SCRATCHLM_CPU_MAX_GHZ) x 128 FLOP/cycle (AVX512-BF16)"
    # more threads than the process may use add nothing
    assert cpu.peak_flops_bound("float32", threads=16)[0] == pytest.approx(4 * 3.5e9 * 64)


def _sys_cpu(root, khz: list[int], driver: str | None = None, boost: str | None = None) -> None:
    for n, k in enumerate(khz):  # cpufreq's figures, in kHz
        (root / f"cpu{n}" / "cpufreq").mkdir(parents=True)
        (root / f"cpu{n}" / "cpufreq" / "cpuinfo_max_freq").write_text(f"{k}\n")
        if driver:
            (root / f"cpu{n}" / "cpufreq" / "scaling_driver").write_text(driver + "\n")
    if boost is not None:
        (root / "cpufreq").mkdir()
        (root / "cpufreq" / "boost").write_text(boost + "\n")


@pytest.mark.parametrize("khz, driver, boost, expected", [
    ([], None, None, cpu.CLOCK_CEILING_GHZ),                            # no cpufreq (a VM)
    ([2_000_000, 4_100_000], "intel_pstate", None, 4.1),                  # the largest counts, turbo included
    ([3_000_000], "amd-pstate-epp", "1", 3.0),                            # amd-pstate's maximum is the boost clock
    ([3_000_000], "acpi-cpufreq", "1", cpu.CLOCK_CEILING_GHZ),            # acpi-cpufreq's leaves boost out
    ([3_000_000], "acpi-cpufreq", "0", 3.0),                              # ... unless boost is off
    ([1_800_000], "cpufreq-dt", None, 1.8),
])
def test_the_highest_clock_comes_from_cpufreq_only_where_it_includes_boost(monkeypatch, tmp_path, khz, driver, boost,
                                                                           expected):
    monkeypatch.delenv("SCRATCHLM_CPU_MAX_GHZ", raising=False)
    monkeypatch.setattr(cpu, "_SYS_CPU", str(tmp_path))
    _sys_cpu(tmp_path, khz, driver, boost)
    ghz, source = cpu.max_clock_ghz()
    assert ghz == expected
    assert source.startswith("the ceiling") == (expected == cpu.CLOCK_CEILING_GHZ)


@pytest.mark.parametrize("value", ["fast", "0", "-3", "nan", "inf", "1e9"])
def test_a_stated_clock_must_be_a_sane_number(monkeypatch, value):
    monkeypatch.setenv("SCRATCHLM_CPU_MAX_GHZ", value)
    with pytest.raises(UserError, match="SCRATCHLM_CPU_MAX_GHZ"):
        cpu.max_clock_ghz()


def test_no_matmul_on_this_machine_reaches_the_bound():
    """One real measurement against the bound (not against another measurement): the best of
    short float32 and bfloat16 matmul bursts with torch's threads stays below it."""
    for dtype in ("float32", "bfloat16"):
        bound = device_peak(torch.device("cpu"), dtype)
        if bound is None:
            pytest.skip(f"no bound is known for this CPU ({cpu.cpu_name()})")
        assert cpu.matmul_flops(getattr(torch, dtype), sizes=(128, 256), bursts=3) < bound[0]


def test_the_training_log_says_what_mfu_divides_by(tmp_path):
    text = "To be, or not to be, that is the question.\n" * 40
    (tmp_path / "t.txt").write_text(text)
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache"), "SCRATCHLM_CPU_MAX_GHZ": "2.5",
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "scratchlm", "train", "--preset", "smoke", "--data", str(tmp_path / "t.txt"),
                          "--out_dir", str(tmp_path / "run"), "--max_steps", "2", "--device", "cpu", "--threads", "1",
                          "--dtype", "float32", "--block_size", "16", "--tokenizer", "char"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    per_cycle = cpu.flops_per_cycle("float32")
    if per_cycle is None:
        pytest.skip("no bound is known for this CPU")
    assert f"MFU is of {2.5e9 * per_cycle[0] / 1e9:.2f} GFLOP/s: 1 cores x 2.5 GHz (SCRATCHLM_CPU_MAX_GHZ)" in out.stdout + out.stderr


def test_a_bad_stated_clock_is_refused_before_the_run_folder_is_made(tmp_path):
    (tmp_path / "t.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache"), "SCRATCHLM_CPU_MAX_GHZ": "abc"}
    out = subprocess.run([sys.executable, "-m", "scratchlm", "train", "--preset", "smoke", "--data", str(tmp_path / "t.txt"),
                          "--out_dir", str(tmp_path / "run"), "--max_steps", "2", "--block_size", "16", "--tokenizer", "char"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["error: SCRATCHLM_CPU_MAX_GHZ='abc': give the CPU's highest clock in GHz, a number such as 3.5"]
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
