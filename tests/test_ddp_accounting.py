"""The figures a run of several processes logs (torchrun, gloo on CPU): tokens count every
process's rows, and MFU is per device, i.e. divided by the number of processes. The DDP tests of
test_distributed compare losses and weights only; both of these survived a hand mutation of issue
30 (scripts/mutate.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="this torch has no gloo backend"),
]

B, T, ACCUM, STEPS = 2, 16, 2, 3


def _train(tmp_path: Path, text: Path, name: str, nproc: int) -> tuple[list[dict], str]:
    args = ["train", "--data", str(text), "--data_cache", str(tmp_path / "data"), "--out_dir", str(tmp_path / name),
            "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--block_size", str(T), "--dropout", "0.0",
            "--batch_size", str(B), "--grad_accum", str(ACCUM), "--max_steps", str(STEPS), "--warmup_steps", "0",
            "--log_interval", "1", "--eval_interval", "0", "--eval_iters", "1", "--sample_tokens", "0",
            "--checkpoint_interval", "100", "--dtype", "float32", "--progress", "lines", "--threads", "1"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone"]
    cmd = (launcher if nproc > 1 else [sys.executable]) + ["-m", "scratchlm", *args]
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == "train"], proc.stdout


def test_two_processes_count_both_processes_tokens_and_report_mfu_per_device(tmp_path):
    rng = random.Random(0)
    words = "the a king queen speaks runs to of and in my thy lord love night day sword crown".split()
    text = tmp_path / "text.txt"
    text.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(200)))
    two, two_said = _train(tmp_path, text, "two", nproc=2)
    one, one_said = _train(tmp_path, text, "one", nproc=1)
    # tokens seen after step s: s steps x 2 processes x B rows x T tokens x ACCUM micro-batches
    assert [r["tokens"] for r in two] == [s * 2 * B * T * ACCUM for s in range(1, STEPS + 1)]
    assert [r["tokens"] for r in one] == [s * B * T * ACCUM for s in range(1, STEPS + 1)]
    assert f" {2 * B * T * ACCUM:,} tokens/step," in two_said  # the run's first line says the same
    assert f" {B * T * ACCUM:,} tokens/step," in one_said
    # MFU = FLOPs per token x tokens/s / (devices x peak of one): with the same model, dtype and
    # threads, mfu / tokens_per_s is FLOPs per token / peak for one process and half that for two
    # (a ratio of two figures of one log line each: no two timings are compared)
    if one[0]["mfu"] is None:
        pytest.skip("no peak FLOP/s for this CPU, so the run reports no MFU")
    per_token_one = {r["mfu"] / r["tokens_per_s"] for r in one if r["tokens_per_s"] > 0}
    per_token_two = {r["mfu"] / r["tokens_per_s"] for r in two if r["tokens_per_s"] > 0}
    assert per_token_one and per_token_two
    for a in per_token_one:
        for b in per_token_two:
            assert a / b == pytest.approx(2.0, rel=1e-9)
