"""How well a model predicts a text: loss, perplexity and bits per byte over a whole file.

The text becomes ids with the model's tokenizer, after its BOS (so the first character is
predicted too, as every training document begins with BOS). A model sees at most `block_size`
ids at once, so a longer text is read in windows:

    ids  t0 t1 t2 ... t(N-1)            every t(i), i >= 1, is predicted exactly once
    window starting at b: inputs t(b) .. t(b+L-1), targets t(b+1) .. t(b+L), L <= block_size
    the next window starts `stride` later and scores only targets the windows before it did not

With stride = block_size the windows do not overlap and each target sees the context from the
start of its window; a smaller stride gives every target at least block_size - stride ids of
context, at block_size / stride times the work (the "sliding window" of Hugging Face's
perplexity guide, with the same windows and targets).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from scratchlm.errors import UserError
from scratchlm.machine.memory import check_batch_fits
from scratchlm.model.gpt import GPT, eval_mode


@dataclass
class Score:
    loss: float
    """Mean negative log-likelihood of the scored tokens, in nats."""
    perplexity: float
    bits_per_byte: float
    """Total bits over the text's UTF-8 bytes: comparable across tokenizers."""
    tokens: int
    """Tokens scored (every token of the text)."""
    bytes: int
    windows: int
    stride: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def windows(n_ids: int, block_size: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, length, first scored position within the window) of each window over n_ids ids:
    inputs ids[start : start + length], targets ids[start + 1 : start + length + 1], of which
    the targets from `first` on are scored. Together they score ids 1 .. n_ids - 1 once each."""
    if not 1 <= stride <= block_size:
        raise UserError(f"--stride must be between 1 and the context length {block_size}, got {stride}")
    out, scored_to, start = [], 0, 0  # scored_to: the last target position scored so far
    while scored_to < n_ids - 1:
        length = min(block_size, n_ids - 1 - start)
        out.append((start, length, scored_to - start))  # targets up to scored_to were done before
        scored_to = start + length
        start += stride
    return out


@torch.inference_mode()
def score_ids(model: GPT, ids: list[int], stride: int | None = None, batch_size: int = 8,
              on_window: Callable[[int, int], None] | None = None) -> tuple[float, int, int]:
    """(sum of the negative log-likelihoods in nats, tokens scored, windows) of ids 1 .. N-1 given
    what comes before each (see the module's docstring). on_window(done, total) reports progress."""
    block = model.config.block_size
    stride = block if stride is None else stride
    plan = windows(len(ids), block, stride)
    device = next(model.parameters()).device
    check_batch_fits(model.config, device, min(batch_size, len(plan)), block, f"scoring {min(batch_size, len(plan)):,} "
                     f"windows of {block:,} tokens at once", "--batch-size")
    data = torch.tensor(ids, dtype=torch.long)
    total, count = 0.0, 0
    with eval_mode(model):
        for i in range(0, len(plan), batch_size):
            group = plan[i : i + batch_size]
            width = max(length for _, length, _ in group)
            x = torch.zeros(len(group), width, dtype=torch.long)
            y = torch.full((len(group), width), -1, dtype=torch.long)  # -1: not scored
            for row, (start, length, first) in enumerate(group):
                x[row, :length] = data[start : start + length]
                y[row, first:length] = data[start + 1 + first : start + 1 + length]
            logits, _ = model(x.to(device))
            nll = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), ignore_index=-1,
                                  reduction="sum")
            total += float(nll.double())
            count += int((y >= 0).sum())
            if on_window is not None:
                on_window(min(i + batch_size, len(plan)), len(plan))
    return total, count, len(plan)


def score_text(model: GPT, tokenizer, text: str, stride: int | None = None, batch_size: int = 8,
               on_window: Callable[[int, int], None] | None = None) -> Score:
    """The Score of `text` under `model` and its `tokenizer` (see the module's docstring)."""
    ids = tokenizer.encode(text)
    if not ids:
        raise UserError("the text is empty after tokenization; nothing to score")
    if max(ids) >= model.config.vocab_size:
        raise UserError(f"the tokenizer gives ids up to {max(ids)}, beyond the model's vocabulary of "
                        f"{model.config.vocab_size}; they do not belong together")
    bos = getattr(tokenizer, "bos_id", None)
    if bos is not None and bos < model.config.vocab_size:
        ids = [bos] + ids
    elif len(ids) < 2:
        raise UserError("the text is a single token and the tokenizer has no BOS to predict it from")
    stride = model.config.block_size if stride is None else stride
    nll, count, n_windows = score_ids(model, ids, stride, batch_size, on_window)
    loss = nll / count
    n_bytes = len(text.encode("utf-8"))
    return Score(loss=loss, perplexity=math.exp(min(loss, 700.0)), bits_per_byte=nll / math.log(2) / n_bytes,
                 tokens=count, bytes=n_bytes, windows=n_windows, stride=stride)
