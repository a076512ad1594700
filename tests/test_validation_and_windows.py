"""What a run measures itself on: the mid-run validation loss is the loss of the validation
tokens (not the training ones) with dropout off, computed here by hand from the checkpoint of that
step; and random training windows reach every start, the last one included (brute force over all
the starts a tiny array allows). Each survived a hand mutation of issue 30 (scripts/mutate.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchlm.data import BatchStream, read_split
from scratchlm import checkpoint as ck
from scratchlm.training.train import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _text(path: Path) -> Path:
    rng = random.Random(3)
    words = "the a king queen speaks runs to of and in my thy lord love night day".split()
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))).capitalize() + "."
                              for _ in range(150)) + "\n", encoding="utf-8")
    return path


def _loss_by_hand(model, stream: BatchStream, batches: int) -> float:
    """Mean cross-entropy over every row of the stream's next `batches` batches, one plain
    forward per row of T + 1 tokens."""
    losses = []
    with torch.no_grad():
        for _ in range(batches):
            x, y = stream.next_batch()
            for row_x, row_y in zip(x, y):
                logits, _ = model(row_x[None])
                losses.append(F.cross_entropy(logits[0].float(), row_y).item())
    return sum(losses) / len(losses)


def test_mid_run_validation_is_the_validation_loss_with_dropout_off(tmp_path):
    """Step 2 of 4 evaluates (eval_interval 2) and saves; its logged val_loss must be the loss of
    that checkpoint, in eval mode, on the validation windows evaluation draws (batch k of the
    seed + 1 stream, as evaluation's docstring says). Dropout 0.5 makes a training-mode pass,
    and the training tokens, score far from it."""
    B, T, iters, seed = 2, 8, 3, 5
    cfg = TrainConfig(data=str(_text(tmp_path / "a.txt")), tokenizer="char", batch_size=B, max_steps=4, lr=3e-3,
                      warmup_steps=1, eval_interval=2, eval_iters=iters, log_interval=1, checkpoint_interval=2,
                      sample_tokens=0, progress="quiet", out_dir=str(tmp_path / "run"), seed=seed,
                      data_cache=str(tmp_path / "data"), threads=1, dtype="float32",
                      model_overrides=dict(n_layer=1, n_head=2, n_embd=16, block_size=T, dropout=0.5))
    train(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [logged] = [r["val_loss"] for r in records if r["event"] == "eval" and r["step"] == 2]
    data_dir = Path(records[0]["data_dir"])
    val, trn = read_split(data_dir, "val"), read_split(data_dir, "train")
    model, _, _ = ck.load_model(tmp_path / "run" / "ckpt-00000002")  # eval mode
    want = _loss_by_hand(model, BatchStream(val, B, T, seed=seed + 1), iters)
    assert logged == pytest.approx(want, rel=1e-5)
    # the controls: what the mutants would log is far off (so the check above can tell them apart)
    assert abs(_loss_by_hand(model, BatchStream(trn, B, T, seed=seed + 1), iters) - want) > 1e-3
    model.train()
    torch.manual_seed(0)
    assert abs(_loss_by_hand(model, BatchStream(val, B, T, seed=seed + 1), iters) - want) > 1e-3


@pytest.mark.parametrize("world_size", [1, 2])
def test_random_windows_start_everywhere_the_last_start_included(world_size):
    """An array of n tokens holds windows of T + 1 starting at 0 .. n - T - 1 (per rank's part).
    The tokens are their own positions, so x[:, 0] is each window's start; 300 draws of 4 rows
    from 3 possible starts miss one with probability about 3 * (2/3)**1200."""
    T, part = 5, 8
    tokens = np.arange(part * world_size, dtype=np.uint16)
    for rank in range(world_size):
        stream = BatchStream(tokens, 4, T, seed=1, rank=rank, world_size=world_size)
        seen = set()
        for _ in range(300):
            x, y = stream.next_batch()
            assert torch.equal(y, x + 1)  # each row is one window: y is x shifted by one
            seen.update(x[:, 0].tolist())
        lo = rank * part
        assert seen == {lo + s for s in range(part - T)}  # {lo, lo + 1, lo + 2}: the last is lo + part - T - 1
