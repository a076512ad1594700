"""The training batches of one process in a run of W processes (W = 1 without torchrun)."""

from __future__ import annotations

import torch

from scratchlm.training.distributed import Dist


class RankBatches:
    """This process's share of each global batch: rows rank, rank + W, ... of a (B * W, T) batch.

    Every process draws the same global batch from the same seeded stream and keeps its rows, so
    W processes with batch B see exactly the rows one process with batch B * W would, and their
    averaged loss and gradient equal that one process's (up to summation order).
    """

    def __init__(self, tokens, batch_size: int, block_size: int, seed: int, d: Dist, starts=None):
        from scratchlm.data import BatchStream

        self.stream = BatchStream(tokens, batch_size * d.world_size, block_size, seed=seed, starts=starts)
        self.rank, self.world_size = d.rank, d.world_size
        self.drawn = 0
        """Input positions of every global batch drawn so far (the loop's token count)."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.stream.next_batch()  # (B * W, T) each
        self.drawn += x.numel()
        return x[self.rank :: self.world_size], y[self.rank :: self.world_size]  # (B, T) each

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)
