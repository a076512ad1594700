"""benchmarks/bench_train_gpu.py: the GPU training benchmark's code path, run on the CPU at a tiny
size (the real run needs CUDA; this checks everything but the device)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_train_gpu, harness
from scratchlm.model.config import GPTConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py

TINY = dict(n_layer=1, n_head=2, n_embd=32, vocab_size=512)


def test_without_cuda_it_skips_with_a_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the benchmark would run for real")
    r = bench_train_gpu.run("cuda")
    assert r["skipped"] == "no CUDA device on this machine" and r["targets"] == []
    assert harness.rows_for("train-gpu", {"result": r}) == [
        ("train gpu", "skipped: no CUDA device on this machine", "", "", "")]


def test_our_step_is_a_real_training_step():
    config = GPTConfig.from_name("gpt2-124m", block_size=16, **TINY)
    step, model = bench_train_gpu.our_step(config, 2, torch.device("cpu"), compile=False)
    losses = [step()[0] for _ in range(30)]  # the same batch every step: it must be learned
    assert losses[-1] < losses[0] - 0.5
    assert model.transformer.wte.weight.grad is None  # zero_grad ran


def test_the_same_path_runs_on_the_cpu_and_its_figures_add_up():
    r = bench_train_gpu.run("cpu", shape="gpt2-124m", batch=2, block_size=16, steps=2, blocks=2, warmup=1,
                            compile=False, **TINY)
    assert r["device"] == "cpu" and not r["flash_attention"] and r["block_size"] == 16
    assert set(r["models"]) == {"ours bf16", "hf bf16"}
    ours = r["models"]["ours bf16"]
    # tokens/s from the step time, and MFU from FLOPs counted here by hand: 6 per matmul weight
    # per token (each block's 12 C^2, and the tied head) plus attention's 12 * L * C * T; biases
    # and norms are not matmuls
    C, L, T, V = 32, 1, 16, 512
    blocks = L * (12 * C * C + 13 * C) + 2 * C  # matrices, biases and two norms per block; final norm
    assert ours["params"] == blocks + V * C + T * C  # + the token table (also the tied head) + positions
    flops = 6 * (L * 12 * C * C + V * C) + 12 * L * C * T
    assert ours["median_tok_s"] == pytest.approx(2 * T / ours["step_median_s"])
    assert ours["mfu"] == pytest.approx(flops * ours["median_tok_s"] / ours["peak_flops"], rel=1e-9)
    assert ours["peak_memory_mb"] is None  # CUDA only
    assert r["ratio_tok_s"] == pytest.approx(ours["median_tok_s"] / r["models"]["hf bf16"]["median_tok_s"])
    rows = harness.rows_for("train-gpu", {"result": r})
    # a CPU: the bound from cores x clock x FLOPs per cycle, the same for both models (no probe)
    assert ours["peak_flops"] == r["models"]["hf bf16"]["peak_flops"] and "cores x" in ours["peak_source"]
    scale, unit = (1e12, "TFLOP/s") if ours["peak_flops"] >= 1e12 else (1e9, "GFLOP/s")
    peak = f"{ours['peak_flops'] / scale:.0f} {unit} bound bf16"
    assert [row[1] for row in rows] == ["ours bf16", f"ours bf16 MFU (of {peak})", "hf bf16", f"hf bf16 MFU (of {peak})"]
