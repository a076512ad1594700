import pytest
import torch


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
