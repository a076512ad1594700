import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch


# One build of the compiled kernels per test session (scratchlm.kernels), shared with the processes
# the tests start: many of them point SCRATCHLM_CACHE at a fresh folder, where each would otherwise
# build the library again (several seconds). The tests of the build itself clear this (test_kernels).
_KERNEL_CACHE = None
if not os.environ.get("SCRATCHLM_KERNEL_CACHE"):
    _KERNEL_CACHE = tempfile.mkdtemp(prefix="scratchlm-test-kernels-")
    os.environ["SCRATCHLM_KERNEL_CACHE"] = _KERNEL_CACHE


def pytest_sessionfinish(session, exitstatus):
    if _KERNEL_CACHE:
        shutil.rmtree(_KERNEL_CACHE, ignore_errors=True)


SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
"""Test and benchmark data beside the checkout (Tiny Shakespeare, GPT-2's tokenizer files)."""

SHARED_MISSING = "shared data missing:"
"""How a skip for lack of SHARED_DATA begins; the end of the run counts them out loud."""


def needs_shared(relpath: str) -> pytest.MarkDecorator:
    """Skip the test, with a reason the summary counts, when SHARED_DATA/relpath is missing."""
    path = SHARED_DATA / relpath
    return pytest.mark.skipif(not path.exists(), reason=f"{SHARED_MISSING} {path}")


def shared_file(relpath: str) -> Path:
    """SHARED_DATA/relpath, or skip the calling test as needs_shared does."""
    path = SHARED_DATA / relpath
    if not path.exists():
        pytest.skip(f"{SHARED_MISSING} {path}")
    return path


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Tests skipped for lack of ../shared/data are counted at the very end, in red, so a clone
    without it cannot pass quietly with fewer tests."""
    missing = [r for r in terminalreporter.stats.get("skipped", []) if SHARED_MISSING in str(r.longrepr)]
    if missing:
        terminalreporter.write_sep("!", f"{len(missing)} tests did not run: {SHARED_DATA} is missing", red=True)
        for report in missing:
            terminalreporter.write_line(f"  not run: {report.nodeid}", red=True)


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine torch's thread pool
    makes each step many times slower; the setting is restored for the rest of the suite."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _kernel_variants() -> list[str]:
    from scratchlm import kernels
    return kernels.runnable_variants()


@pytest.fixture(params=_kernel_variants())
def kernel_variant(request, monkeypatch):
    """Each variant of the decoding kernels this CPU can execute (scratchlm.kernels.VARIANTS), in
    turn, as the one `cpu_kernels()` returns; yields the loaded kernels. A variant that does not
    build here is skipped with the build's reason (the package then falls back to PyTorch)."""
    from scratchlm import kernels
    monkeypatch.setenv("SCRATCHLM_KERNEL_VARIANT", request.param)
    loaded = kernels.cpu_kernels()
    if loaded is None:
        pytest.skip(f"kernel variant {request.param}: {kernels.kernel_status()}")
    return loaded


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A runs folder holding one trained run, `mixed` (English and Chinese text, a char tokenizer):
    what the playground's tests serve. Trained once per test file that asks for it."""
    from helpers import train_serve_run

    base = tmp_path_factory.mktemp("serve")
    folder = base / "runs"
    train_serve_run(base, folder / "mixed")
    return folder


@pytest.fixture(scope="module")
def served(runs):
    """The playground on `runs`, in a thread of this process, with the default limits."""
    from helpers import Served
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=runs)) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, driven by Playwright (the browser tests skip without them: NEEDS_BROWSER)."""
    from helpers import CHROMIUM, CHROMIUM_ARGS, pw

    with pw.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
