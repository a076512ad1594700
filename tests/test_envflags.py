"""scratchlm.envflags: every on/off environment variable read one way, anything else refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scratchlm.envflags import SWITCHES, env_switch
from scratchlm.errors import UserError
from scratchlm.machine import cpu

# written out by hand, not taken from envflags' own lists
READINGS = {"1": True, "true": True, "TRUE": True, "yes": True, "On": True, " 1 ": True,
            "0": False, "false": False, "False": False, "no": False, "OFF": False, "": None, "  ": None}


@pytest.mark.parametrize("raw, want", READINGS.items())
def test_each_accepted_spelling_reads_as_it_says(monkeypatch, raw, want):
    monkeypatch.setenv("SCRATCHLM_NO_KERNELS", raw)
    assert env_switch("SCRATCHLM_NO_KERNELS") is want


def test_unset_reads_as_none(monkeypatch):
    monkeypatch.delenv("SCRATCHLM_CPU_BF16", raising=False)
    assert env_switch("SCRATCHLM_CPU_BF16") is None


@pytest.mark.parametrize("raw", ["maybe", "2", "-1", "yes please", "off-ish", "0.0"])
def test_any_other_value_is_refused_naming_the_variable_and_the_values(monkeypatch, raw):
    monkeypatch.setenv("SCRATCHLM_CPU_BF16", raw)
    with pytest.raises(UserError) as caught:
        env_switch("SCRATCHLM_CPU_BF16")
    message = str(caught.value)
    assert message.startswith(f"SCRATCHLM_CPU_BF16={raw!r}") and "1 or 0" in message and "true/false" in message


@pytest.mark.parametrize("raw, native", [("false", False), ("no", False), ("true", True), ("on", True)])
def test_cpu_bf16_takes_the_words_too(monkeypatch, raw, native):
    """Before, only "0" and "1" were read: SCRATCHLM_CPU_BF16=false left bfloat16 on, silently."""
    monkeypatch.setenv("SCRATCHLM_CPU_BF16", raw)
    assert cpu.bf16_reason() == (native, f"SCRATCHLM_CPU_BF16={raw}")
    assert cpu.forced_off() is (not native and cpu.hardware_bf16())


def _cli(argv: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    return subprocess.run([sys.executable, "-m", "scratchlm", *argv], capture_output=True, text=True, timeout=300,
                          env={**base, "SCRATCHLM_CACHE": str(tmp_path / "cache"), **env}, cwd=tmp_path)


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_the_command_line_refuses_a_bad_switch_before_any_work(tmp_path, name):
    """One line naming the variable and what it takes, exit 2, and the run folder never made."""
    (tmp_path / "t.txt").write_text("hello world\n" * 50, encoding="utf-8")
    done = _cli(["train", "--data", "t.txt", "--tokenizer", "char", "--max_steps", "1", "--out_dir", "run"], tmp_path,
                **{name: "maybe"})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(f"error: {name}='maybe'")
    assert "1 or 0" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


@pytest.mark.skipif(sys.platform != "linux", reason="the kernels are only built on Linux")
def test_no_kernels_no_leaves_the_kernels_on(tmp_path):
    """SCRATCHLM_NO_KERNELS=no used to turn them off (any value but "" and "0" did)."""
    said = {}
    for value in ("no", "yes"):
        done = _cli(["doctor", "--json", "--no-measure"], tmp_path, SCRATCHLM_NO_KERNELS=value)
        assert done.returncode == 0, done.stderr
        said[value] = json.loads(done.stdout)["kernel_status"]
    assert said["yes"].startswith("off (SCRATCHLM_NO_KERNELS")
    assert not said["no"].startswith("off"), said["no"]
