"""scratchlm.kernels: the compiled bfloat16 gemv, checked against float64 matmuls done here, and
its fallbacks when it cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchlm import kernels
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py
MACHINERY = pytest.mark.machinery
"""The kernel cache's own bookkeeping (switches, fallbacks, records, damaged files): the same whatever
the CPU's bfloat16, so .ci/run's bfloat16-off pass leaves these out; every variant's build under
that switch is still made by the gemv tests."""

KERNEL = kernels.cpu_kernels()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason=f"bf16 gemv kernel: {kernels.kernel_status()}")


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernel=None) -> torch.Tensor:
    """float64 x W^T + b, with x rounded to bfloat16 where the kernel's loop does so (the
    AVX512-BF16 loop; `rounds_input`, documented in bf16_dot.h)."""
    if (kernel or KERNEL).rounds_input:
        x = x.bfloat16()
    y = x.double() @ weight.double().t()
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("n_out, k", [(96, 64), (50, 37), (7, 1000), (300, 31), (2304, 768)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gemv_matches_a_float64_matmul(kernel_variant, rows, n_out, k, with_bias, dtype):
    g = torch.Generator().manual_seed(rows * 1000 + k)
    weight = torch.randn(n_out, k, generator=g).to(dtype)
    x = torch.randn(rows, k, generator=g)
    bias = torch.randn(n_out, generator=g) if with_bias else None
    got = kernel_variant(x, weight, bias)
    if dtype == torch.float32:  # float32 weights: the input is not rounded
        want = x.double() @ weight.double().t() + (0 if bias is None else bias.double())
    else:
        want = _reference(x, weight, bias, kernel_variant)
    assert got.dtype == torch.float32 and got.shape == (rows, n_out)
    # float32 sums of k products of size ~1: a few float32 ulps of sqrt(k)
    torch.testing.assert_close(got.double(), want, atol=2e-6 * k ** 0.5 * 4, rtol=1e-5)
    if dtype == torch.bfloat16:  # and the other rounding is clearly off: the check tells them apart
        other = x.double() if kernel_variant.rounds_input else x.bfloat16().double()
        wrong = other @ weight.double().t() + (0 if bias is None else bias.double())
        assert (wrong - want).abs().max() > 10 * 2e-6 * k ** 0.5 * 4


def test_each_variant_builds_the_loop_it_names(kernel_variant):
    """Which loop of bf16_dot.h each variant compiles, and how it rounds: the fixed x86 levels by
    their instruction sets; "native" by what this CPU has (AVX512-BF16 unless switched off)."""
    from scratchlm.machine import cpu

    expected = {"x86-64-v4": "avx512f", "x86-64-v3": "avx2", "x86-64-v2": "portable", "scalar": "portable"}
    if kernel_variant.variant == "native":
        if cpu.native_bf16() and cpu.is_x86():
            assert kernel_variant.loop == "avx512-bf16"
        elif {"avx512f", "avx512bw", "avx512vl"} <= cpu.cpu_flags():
            assert kernel_variant.loop == "avx512f"
        elif {"avx2", "fma"} <= cpu.cpu_flags():
            assert kernel_variant.loop == "avx2"
        else:
            assert kernel_variant.loop == "portable"
    else:
        assert kernel_variant.loop == expected[kernel_variant.variant]
    assert kernel_variant.rounds_input == (kernel_variant.loop == "avx512-bf16") == kernel_variant.uses_dpbf16
    assert kernels.kernel_status().startswith(f"compiled ({kernel_variant.variant}: {kernel_variant.loop} loop")


@needs_kernel
def test_gemv_keeps_leading_dims_and_splits_rows_between_threads():
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(4099, 96, generator=g).bfloat16()  # big enough to run in parallel; odd row count
    x = torch.randn(2, 1, 96, generator=g)
    want = _reference(x.reshape(2, 96), weight, None).reshape(2, 1, 4099)
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = KERNEL(x, weight)
            assert got.shape == (2, 1, 4099)
            torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)
    finally:
        torch.set_num_threads(previous)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_out, k", [(4099, 96), (1000, 65), (64, 1024), (63, 1024), (7, 32)])
def test_gemv_splits_rows_between_threads_as_documented(threads, n_out, k):
    """gemv_bf16.c's rule: from GEMV_PARALLEL_MIN multiply-adds per row of x the output rows go to
    the threads in contiguous blocks, one per thread, in thread order, sizes differing by at most
    one; below it one thread takes them all. Read off the kernel's own loop (row_owners)."""
    from scratchlm.kernels import GEMV_PARALLEL_MIN

    weight = torch.randn(n_out, k, generator=torch.Generator().manual_seed(n_out))
    x = torch.randn(2, k)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        owners = KERNEL.row_owners(x, weight).tolist()
    finally:
        torch.set_num_threads(previous)
    team = threads if n_out * k >= GEMV_PARALLEL_MIN else 1
    sizes = [owners.count(t) for t in range(team)]
    assert sum(sizes) == n_out and max(sizes) - min(sizes) <= 1  # every row once, shared evenly
    assert owners == sorted(owners)  # contiguous blocks in thread order


@needs_kernel
def test_gemv_rejects_what_it_cannot_compute():
    weight = torch.randn(16, 32).bfloat16()
    with pytest.raises(ValueError, match="at most"):
        KERNEL(torch.randn(KERNEL.max_rows + 1, 32), weight)
    with pytest.raises(ValueError, match="at most"):
        KERNEL(torch.randn(1, 31), weight)
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        KERNEL(torch.randn(1, 32), weight.double())
    with pytest.raises(ValueError, match="bfloat16"):
        KERNEL(torch.randn(1, 32), torch.randn(32, 16).bfloat16().t())  # (16, 32), not contiguous
    with pytest.raises(ValueError, match="bias"):
        KERNEL(torch.randn(1, 32), weight, torch.randn(15))


SWITCHES = ("SCRATCHLM_NO_KERNELS", "SCRATCHLM_KERNEL_VARIANT", "SCRATCHLM_CPU_BF16", "SCRATCHLM_KERNEL_CACHE")


def _environment(**env: str) -> dict[str, str]:
    """This process's environment without the switches a CI pass may have set (these tests are
    about building), plus `env`."""
    return {**{k: v for k, v in os.environ.items() if k not in SWITCHES}, **env}


def _status_in_subprocess(env: dict[str, str], tmp_path: Path) -> str:
    code = ("from scratchlm import kernels\n"
            "from scratchlm.kernels import decoding_copy as decoding\n"
            "import torch\n"
            "print(kernels.kernel_status())\n"
            "print(decoding._default_layout(torch.bfloat16))\n")
    full_env = _environment(SCRATCHLM_CACHE=str(tmp_path / "cache"), **env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)
    assert done.returncode == 0, done.stderr
    if done.stdout.startswith("build failed"):  # one line says so, no traceback
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("scratchlm: compiled kernels not used")
    return done.stdout


@MACHINERY
def test_switched_off_by_the_environment(tmp_path):
    out = _status_in_subprocess({"SCRATCHLM_NO_KERNELS": "1"}, tmp_path)
    assert out.startswith("off (SCRATCHLM_NO_KERNELS is set)")
    assert out.splitlines()[1] in ("packed", "in_out")
    assert not (tmp_path / "cache").exists()


@MACHINERY
@pytest.mark.skipif(sys.platform != "linux", reason="the kernel is only built on Linux")
def test_a_failing_compiler_falls_back_and_leaves_no_half_built_library(tmp_path):
    out = _status_in_subprocess({"CC": "false"}, tmp_path)  # also checks the one line on stderr
    assert out.startswith("build failed"), out
    assert out.splitlines()[1] in ("packed", "in_out")
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []  # the temporary file was removed


@MACHINERY
@pytest.mark.skipif(sys.platform != "linux", reason="the kernel is only built on Linux")
def test_no_compiler_falls_back(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    out = _status_in_subprocess({"PATH": str(empty), "CC": ""}, tmp_path)
    assert out.startswith("no C compiler found"), out


@MACHINERY
@needs_kernel
def test_built_once_then_loaded_from_the_cache(tmp_path):
    first = _status_in_subprocess({}, tmp_path)
    built = list((tmp_path / "cache" / "kernels").glob("*.so"))
    assert first.startswith("compiled") and len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    second = _status_in_subprocess({}, tmp_path)
    assert second == first
    assert [p.stat().st_mtime_ns for p in (tmp_path / "cache" / "kernels").glob("*.so")] == [stamp]


@MACHINERY
def test_an_unknown_variant_falls_back_with_one_line(tmp_path):
    code = "from scratchlm import kernels\nprint(kernels.kernel_status())\nprint(kernels.cpu_kernels())\n"
    env = _environment(SCRATCHLM_CACHE=str(tmp_path / "cache"), SCRATCHLM_KERNEL_VARIANT="avx9000")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("unknown variant 'avx9000'") and done.stdout.splitlines()[1] == "None"
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("scratchlm: compiled kernels not used")


def test_a_variant_this_cpu_cannot_run_is_not_built(monkeypatch):
    """Running a library built for instructions the CPU lacks would crash the process (SIGILL):
    such a variant is refused before the compiler is called."""
    from scratchlm.machine import cpu

    monkeypatch.delenv("SCRATCHLM_NO_KERNELS", raising=False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"sse4_2", "ssse3", "popcnt", "cx16"}))
    monkeypatch.setattr(cpu, "is_x86", lambda: True)
    monkeypatch.setattr(kernels, "_loaded", {})
    monkeypatch.setattr(kernels, "_warned", set())
    monkeypatch.setattr(kernels, "_build", lambda *a: pytest.fail("built a variant the CPU cannot run"))
    assert kernels.runnable_variants() == ["native", "x86-64-v2", "scalar"]
    assert kernels.load_variant("x86-64-v3") is None
    assert kernels.kernel_status("x86-64-v3").startswith("not runnable: this CPU cannot execute variant 'x86-64-v3'")


@MACHINERY
@pytest.mark.skipif(sys.platform != "linux" or kernels.compiler() is None, reason="needs Linux and a C compiler")
def test_flags_the_compiler_refuses_are_dropped_in_turn(tmp_path):
    """A compiler that knows neither -march=native nor -fopenmp (some aarch64 and macOS clang
    set-ups): the library is still built, without them, runs on one thread and computes the
    same products."""
    fake = tmp_path / "picky-cc"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in -march=native|-mcpu=native|-fopenmp) "
                    "echo \"picky-cc: unknown option $a\" >&2; exit 1;; esac; done\n"
                    f"exec {kernels.compiler()} \"$@\"\n")
    fake.chmod(0o755)
    code = ("from scratchlm import kernels\nimport torch\nk = kernels.cpu_kernels()\nprint(k.flags)\n"
            "w = torch.randn(64, 40).bfloat16(); x = torch.randn(3, 40)\n"
            "want = (x.bfloat16() if k.rounds_input else x).double() @ w.double().t()\n"
            "print(float((k(x, w).double() - want).abs().max()))\n")
    env = _environment(SCRATCHLM_CACHE=str(tmp_path / "cache"), CC=str(fake))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    flags, error = done.stdout.splitlines()
    assert "-march=native" not in flags and "-fopenmp" not in flags and "-O3" in flags
    assert float(error) < 1e-4


@needs_kernel
@pytest.mark.parametrize("B, H, hs, t_max, pos", [(1, 12, 64, 32, 0), (2, 3, 16, 20, 7), (3, 2, 5, 9, 8)])
def test_attend_one_matches_softmax_attention_done_here(B, H, hs, t_max, pos):
    g = torch.Generator().manual_seed(B * 100 + pos)
    C = H * hs
    k_cache = torch.randn(B, H, t_max, hs, generator=g)
    v_cache = torch.randn(B, H, t_max, hs, generator=g)
    qkv = torch.randn(B, 1, 3 * C, generator=g)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out = KERNEL.attend_one(qkv, k_cache, v_cache, pos, H)
    q, k, v = qkv.double().view(B, 3, H, hs).unbind(1)  # (B, H, hs) each
    keys = torch.cat([before_k[:, :, :pos].double(), k[:, :, None]], 2)  # (B, H, pos + 1, hs)
    values = torch.cat([before_v[:, :, :pos].double(), v[:, :, None]], 2)
    weights = torch.softmax((keys @ q[..., None]).squeeze(-1) / hs ** 0.5, -1)  # (B, H, pos + 1)
    want = (weights[..., None] * values).sum(2).reshape(B, 1, C)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    # the new key and value went into position pos, nothing else moved
    torch.testing.assert_close(k_cache[:, :, pos], k.float())
    torch.testing.assert_close(v_cache[:, :, pos], v.float())
    others = [t for t in range(t_max) if t != pos]
    assert torch.equal(k_cache[:, :, others], before_k[:, :, others])
    assert torch.equal(v_cache[:, :, others], before_v[:, :, others])
    with pytest.raises(ValueError):
        KERNEL.attend_one(qkv, k_cache, v_cache, t_max, H)  # past the end of the cache


# ------------------------------------------------------------------ a damaged cache is never loaded
# The build records the library's size, sha256 and flags (NAME.record.json, written last); a
# library that does not match is built again, or, where that fails, left out with one line.

DAMAGES = ("truncated library", "another library in its place", "binary record and flags", "no record")


def _damage(library: Path, damage: str) -> None:
    record = library.with_suffix(".record.json")
    if damage == "truncated library":  # as `head -c 4096` leaves it: a valid ELF header, then nothing
        library.write_bytes(library.read_bytes()[:4096])
    elif damage == "another library in its place":  # a real shared library, but not ours
        import _ctypes

        library.write_bytes(Path(_ctypes.__file__).read_bytes())
    elif damage == "binary record and flags":
        record.write_bytes(bytes(range(256)) * 4)
        library.with_suffix(".flags").write_bytes(b"\xff\xfe\x00-O3\x80")  # an older scratchlm's flags file
    else:
        record.unlink()


def _cache_copy(tmp_path: Path) -> Path:
    """A kernel cache holding a copy of the session's verified library and its record (no build)."""
    cache = tmp_path / "kernels"
    cache.mkdir()
    for path in (KERNEL.path, KERNEL.path.with_suffix(".record.json")):
        (cache / path.name).write_bytes(path.read_bytes())
    return cache / KERNEL.path.name


@needs_kernel
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_library_that_does_not_match_its_record_is_not_trusted(tmp_path, damage):
    library = _cache_copy(tmp_path)
    assert kernels.verified_flags(library) == KERNEL.flags  # the copy as built: trusted
    _damage(library, damage)
    assert kernels.verified_flags(library) is None


@needs_kernel
def test_a_record_for_other_bytes_or_without_flags_is_not_trusted(tmp_path):
    import hashlib
    import json

    library = _cache_copy(tmp_path)
    record = library.with_suffix(".record.json")
    data = library.read_bytes()
    right = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "flags": ["-O3"]}
    for wrong in ({**right, "sha256": hashlib.sha256(data[:-1]).hexdigest()}, {**right, "size": len(data) - 1},
                  {**right, "flags": "-O3"}, {**right, "flags": [3]}, [right], "text"):
        record.write_text(json.dumps(wrong))
        assert kernels.verified_flags(library) is None, wrong
    record.write_text(json.dumps(right))  # the record written here, by hand, from the bytes: trusted
    assert kernels.verified_flags(library) == ["-O3"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A 2-step run of a 1-layer char model, trained in a subprocess on the PyTorch path."""
    base = tmp_path_factory.mktemp("kernel-cache-run")
    (base / "text.txt").write_text("the king and the queen speak of love and night.\n" * 40, encoding="utf-8")
    argv = ["train", "--data", str(base / "text.txt"), "--tokenizer", "char", "--max_steps", "2", "--batch_size", "2",
            "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16", "--eval_interval", "0",
            "--eval_iters", "1", "--sample_tokens", "0", "--progress", "quiet", "--threads", "1",
            "--out_dir", str(base / "run")]
    done = _scratchlm(argv, base, SCRATCHLM_NO_KERNELS="1")
    assert done.returncode == 0, done.stderr
    return base / "run"


def _scratchlm(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = _environment(SCRATCHLM_CACHE=str(tmp_path / "cache"), **env)
    return subprocess.run([sys.executable, "-m", "scratchlm", *argv], capture_output=True, text=True, env=full_env,
                          timeout=300, cwd=tmp_path)


# damage -> (command, whether a compiler is there to build again); two cases rebuild, two cannot
CACHE_CASES = {"truncated library": ("generate", True), "another library in its place": ("train", False),
               "binary record and flags": ("train", True), "no record": ("generate", False)}


@MACHINERY
@needs_kernel
@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the kernel is only built on Linux")
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cache_ends_in_a_working_command_without_a_traceback(tmp_path, tiny_run, damage):
    """Each in its own process (a library cut short would kill the process with SIGBUS): with a
    compiler the library is built again and used; without one, one line, and PyTorch's path."""
    command, rebuild = CACHE_CASES[damage]
    library = _cache_copy(tmp_path)
    _damage(library, damage)
    damaged = library.read_bytes()
    env = {"SCRATCHLM_KERNEL_CACHE": str(library.parent), **({} if rebuild else {"CC": "false"})}
    # the library this process built is the one the command must look for: with this process's
    # SCRATCHLM_CPU_BF16 (the no-bf16 CI pass sets it), or it would build another variant beside it
    env.update({k: os.environ[k] for k in ("SCRATCHLM_CPU_BF16",) if k in os.environ})
    if command == "generate":
        argv = ["generate", "--checkpoint", str(tiny_run), "--dtype", "bfloat16", "--max-new-tokens", "8", "--seed", "1",
                "--prompt", "the "]
    else:
        argv = ["train", "--init_from", str(tiny_run), "--data", str(tiny_run.parent / "text.txt"), "--max_steps", "1",
                "--batch_size", "2", "--eval_interval", "0", "--eval_iters", "1", "--sample_tokens", "0",
                "--progress", "quiet", "--threads", "1", "--out_dir", str(tmp_path / "run2")]
    done = _scratchlm(argv, tmp_path, **env)
    assert done.returncode == 0, done.stderr  # not -7 (SIGBUS)
    assert "Traceback" not in done.stderr
    status = _scratchlm(["doctor", "--json", "--no-measure"], tmp_path, **env)
    assert status.returncode == 0, status.stderr
    import json

    facts = json.loads(status.stdout)
    if rebuild:  # built again: the library matches its new record and is the one in use
        assert done.stderr == "", done.stderr
        assert kernels.verified_flags(library) is not None
        assert library.read_bytes() != damaged or damage == "binary record and flags"  # same source, same bytes
        assert facts["kernel_status"].startswith("compiled")
        assert facts["kernel_status"].endswith(str(library))
    else:  # cannot be built here: one line, the PyTorch path, and the damaged file never loaded
        assert done.stderr.splitlines() == [line for line in done.stderr.splitlines()
                                            if line.startswith("scratchlm: compiled kernels not used: build failed")]
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert facts["kernel_loop"] is None and facts["kernel_status"].startswith("build failed")
    if command == "generate":
        assert done.stdout.startswith("the ") and len(done.stdout) > len("the ")
    else:
        assert (tmp_path / "run2" / "latest").exists() or any((tmp_path / "run2").glob("ckpt*"))
