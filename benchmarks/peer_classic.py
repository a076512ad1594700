"""The peer for time to loss: the classic CPU "baby GPT" recipe, written here with Hugging Face's
`GPT2LMHeadModel` and `torch.optim.AdamW`, on the same text and threads as our presets.

The recipe (the well-known character-level Shakespeare configuration for a CPU): 4 layers, 4
heads, width 128, context 64, batch 12, learned positions, GELU, no dropout, tied embeddings,
AdamW lr 1e-3 with betas (0.9, 0.99) and weight decay 0.1 on matrices, gradient clipping at 1.0,
100 warmup steps then a cosine decay to 1e-4 at step 2000; the characters of the file as the
vocabulary, its first 90% for training (random windows) and its last 10% for validation.

Validation is the whole split (consecutive windows of 65 characters, every character after a
window's first predicted once), evaluated every `eval_every` steps; its time is left out of the
training time. The figure is the training time to the first evaluation at or below the goal.

    python -m benchmarks.peer_classic --data ../shared/data/tinyshakespeare.txt
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block=64, batch=12, lr=1e-3, min_lr=1e-4, warmup=100, iters=2000,
              beta2=0.99, weight_decay=0.1, grad_clip=1.0)


def _lr(it: int) -> float:
    r = RECIPE
    if it < r["warmup"]:
        return r["lr"] * (it + 1) / (r["warmup"] + 1)
    progress = (it - r["warmup"]) / (r["iters"] - r["warmup"])
    return r["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (r["lr"] - r["min_lr"])


@torch.no_grad()
def whole_split_loss(model, val: np.ndarray, block: int, batch: int = 64) -> float:
    """Mean cross-entropy over consecutive windows of block + 1 ids of `val`."""
    n = (len(val) - 1) // block
    total, count = 0.0, 0
    model.eval()
    for i in range(0, n, batch):
        starts = np.arange(i, min(i + batch, n)) * block
        rows = torch.from_numpy(val[starts[:, None] + np.arange(block + 1)])
        logits = model(input_ids=rows[:, :-1]).logits
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                                       reduction="sum"))
        count += rows[:, 1:].numel()
    model.train()
    return total / count


def _characters(data: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(train ids, validation ids, vocabulary size): the file's characters, split 90 / 10."""
    text = data.read_text(encoding="utf-8")
    chars = sorted(set(text))
    ids = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    lookup = np.zeros(int(ids.max()) + 1, dtype=np.int64)
    lookup[[ord(c) for c in chars]] = np.arange(len(chars))
    ids = lookup[ids]
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:], len(chars)


def make_step(data: Path, seed: int = 1337):
    """(step, vocabulary size): step(it=None) runs one training step of the recipe on a random
    batch (with the schedule's learning rate for iteration `it` when given) and returns the model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    r = RECIPE
    train, _, vocab = _characters(data)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=r["block"], n_embd=r["n_embd"], n_layer=r["n_layer"],
                        n_head=r["n_head"], activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config).train()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": r["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=r["lr"], betas=(0.9, r["beta2"]))
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(r["block"] + 1)
    train_t = torch.from_numpy(train)

    def step(it: int | None = None):
        if it is not None:
            for group in optimizer.param_groups:
                group["lr"] = _lr(it)
        rows = train_t[torch.randint(0, len(train) - r["block"] - 1, (r["batch"],), generator=gen)[:, None] + offsets]
        logits = model(input_ids=rows[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return model

    return step, vocab


def run(data: Path, goal: float = 1.88, eval_every: int = 100, probe_from: float = 0.4, seed: int = 1337,
        threads: int | None = None) -> dict[str, Any]:
    """Train the recipe to its 2000 steps (or until the goal); return the time to the goal and
    the tokens/s. The whole split is scored every eval_every steps from probe_from of the run on."""
    if threads:
        torch.set_num_threads(threads)
    r = RECIPE
    _, val, vocab = _characters(data)
    step, _ = make_step(data, seed)
    trained_s, reached_s, reached_step, evals = 0.0, None, None, []
    for it in range(1, r["iters"] + 1):
        start = time.perf_counter()
        model = step(it - 1)
        trained_s += time.perf_counter() - start
        if (it % eval_every == 0 and it >= probe_from * r["iters"]) or it == r["iters"]:
            val_loss = whole_split_loss(model, val, r["block"])
            evals.append((it, trained_s, val_loss))
            if reached_s is None and val_loss <= goal:
                reached_s, reached_step = trained_s, it
                break
    return {"reached_s": reached_s, "reached_step": reached_step, "train_s": trained_s, "evals": evals,
            "tokens_per_s": evals[-1][0] * r["batch"] * r["block"] / trained_s, "vocab": vocab,
            "final_val_loss": evals[-1][2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    out = run(args.data, threads=args.threads)
    for step, seconds, loss in out["evals"]:
        print(f"step {step:5d}  {seconds:7.1f} s  val {loss:.4f}")
    print(f"reached at step {out['reached_step']} in {out['reached_s']} s; {out['tokens_per_s']:,.0f} tokens/s")


if __name__ == "__main__":
    main()
