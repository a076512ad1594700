"""The fine-tuning stage's batches: conversations rendered by the chat template (scratchlm.text.chat),
B rows at a time, with the same face as pre-training's RankBatches (next_batch -> (x, y), and a
state for exact resume), so the one training loop takes either.

    rows      each conversation's ids and loss mask, cut to block_size + 1 ids
    order     a shuffle of every row per epoch (seed + epoch), B * W rows per step; process r of W
              keeps rows r, r + W, ... of them, as RankBatches does
    padding   right padding to the longest row of the batch: x holds pad_id there and y the
              ignore index, as does every position the mask does not learn, so the loss is the
              mean over the learned targets. Attention is causal, so a real position never
              sees the padding after it: no attention mask is needed.

With several processes each one's loss is the mean over its own learned targets, and the step
averages those means (as Hugging Face's Trainer does by default), not one mean over every target.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import torch

from scratchlm.errors import UserError
from scratchlm.text.chat import ChatRow
from scratchlm.training.distributed import Dist

IGNORE = -100


class ConversationBatches:
    """Batches of chat rows (see the module's docstring)."""

    def __init__(self, rows: Sequence[ChatRow], batch_size: int, block_size: int, seed: int, pad_id: int,
                 d: Dist | None = None):
        d = d or Dist()
        self.rows = cut_rows(rows, block_size)
        if len(self.rows) < batch_size * d.world_size:
            raise UserError(f"{len(self.rows):,} conversations are fewer than one step's batch of "
                            f"{batch_size * d.world_size:,}; use more data or a smaller --batch_size")
        self.batch_size, self.seed, self.pad_id = batch_size, seed, pad_id
        self.rank, self.world_size = d.rank, d.world_size
        self.epoch, self.cursor = 0, 0
        self._order = self._shuffled(0)
        self.rows_sha256 = _digest(self.rows)
        """Of the rows as trained: a resume on other rows is refused."""
        self.drawn = 0
        """Real (unpadded) input positions of every global batch drawn so far (the loop's token count)."""

    def _shuffled(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + epoch).permutation(len(self.rows))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (B, T) with T the batch's longest row less one; the last rows of an epoch
        that do not fill a step are left for the next epoch's shuffle."""
        step = self.batch_size * self.world_size
        if self.cursor + step > len(self._order):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._shuffled(self.epoch)
        everyone = self._order[self.cursor : self.cursor + step]
        self.cursor += step
        self.drawn += sum(len(self.rows[i].ids) - 1 for i in everyone)
        return padded([self.rows[i] for i in everyone[self.rank :: self.world_size]], self.pad_id)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "rows": len(self.rows), "rows_sha256": self.rows_sha256,
                "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Continue where `state` was taken, on the same rows: other rows (another held-out split,
        loss mask or context) would train on what was held out, or on other targets."""
        then = (state.get("rows"), state.get("rows_sha256"), state.get("seed"))
        if then != (len(self.rows), self.rows_sha256, self.seed):
            raise UserError(f"cannot resume the fine-tuning batches: the run trained on {then[0]} rows (seed "
                            f"{then[2]}), now {len(self.rows)} other rows (seed {self.seed}); give the run's own "
                            "--val_fraction, --seed and --train_on")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._shuffled(self.epoch)



def _digest(rows: Sequence[ChatRow]) -> str:
    """sha256 over every row's ids and loss mask, in order."""
    h = hashlib.sha256()
    for row in rows:
        h.update(np.asarray(row.ids, dtype=np.int64).tobytes())
        h.update(np.packbits(np.asarray(row.loss_mask, dtype=bool)).tobytes() + b"|")
    return h.hexdigest()


def padded(batch: Sequence[ChatRow], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y), each (B, T) with T the longest row less one: each row's inputs and targets, right-
    padded with pad_id in x and the ignore index in y (as is every position its mask does not learn)."""
    T = max(len(row.ids) for row in batch) - 1
    x = torch.full((len(batch), T), pad_id, dtype=torch.long)  # (B, T)
    y = torch.full((len(batch), T), IGNORE, dtype=torch.long)  # (B, T)
    for b, row in enumerate(batch):
        n = len(row.ids) - 1
        x[b, :n] = torch.tensor(row.ids[:-1])
        y[b, :n] = torch.tensor(row.targets(IGNORE))
    return x, y


def cut_rows(rows: Sequence[ChatRow], block_size: int, names: Sequence[str] | None = None) -> list[ChatRow]:
    """Each row cut to block_size + 1 ids (block_size inputs, each with its target); one with
    nothing left to learn is refused, naming it (by `names`, else as conversation i)."""
    kept = [ChatRow(row.ids[: block_size + 1], row.loss_mask[: block_size + 1]) for row in rows]
    for i, row in enumerate(kept):
        if not any(row.loss_mask[1:]):
            name = names[i] if names is not None else f"conversation {i + 1:,}"
            raise UserError(f"{name}: nothing to learn within the context of {block_size:,} tokens (its first "
                            "reply starts later); shorten it or use a longer block_size")
    return kept
