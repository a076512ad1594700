"""Muon for the hidden matrices, AdamW for everything else, presented to the loop as one optimizer.

Muon (Keller Jordan, 2024; used by modded-nanogpt and nanochat) keeps a Nesterov momentum of each
weight matrix's gradient, like SGD, but before applying it replaces the momentum M = U S V^T by
(roughly) U V^T: the same directions with every singular value set near 1. A few large singular
directions can no longer dominate the step, so the rare directions learn as fast as the common
ones. torch.optim.Muon does the orthogonalisation with 5 iterations of a quintic Newton-Schulz
polynomial in bfloat16 (3 matmuls each), so each step costs extra compute per hidden matrix; it
pays off when it buys more loss per step than it costs in time per step.

Muon is meant for the matrices *inside* the network. The token and position tables and lm_head
map to and from the vocabulary rather than between hidden features, and norm gains and biases are
vectors: these stay with AdamW, with the usual split (decay on matrices, none on vectors) of
`scratchlm.train.make_optimizer`.

Both halves read the same learning rate: torch's `adjust_lr_fn="match_rms_adamw"` scales Muon's
step by 0.2 * sqrt(max(rows, cols)), which makes its update's RMS about AdamW's (Moonshot's "Muon
is Scalable for LLM Training"), so one lr, one schedule and one weight decay serve both.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def hidden_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable 2-D parameters inside the Transformer blocks (`transformer.h`): the attention
    and MLP weight matrices. Embeddings, lm_head, norms and biases are not among them."""
    gpt = getattr(model, "module", model)  # DistributedDataParallel keeps the GPT as .module
    return [p for p in gpt.transformer.h.parameters() if p.dim() == 2 and p.requires_grad]


class MuonWithAdamW:
    """A torch.optim.Muon and a torch.optim.AdamW over disjoint parameters, driven as one optimizer.

    The training loop only needs what a torch optimizer offers it: `param_groups` (the two
    optimizers' own group dicts, so setting group["lr"] reaches both), `step`, `zero_grad`,
    `state_dict` and `load_state_dict`. GradScaler needs no more either: it unscales the
    gradients of every parameter in param_groups and calls step() unless one was not finite.
    """

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon = muon
        self.adamw = adamw

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self) -> dict:
        """Per-parameter state of both optimizers (Muon's momentum buffers, AdamW's moments)."""
        return {**self.muon.state, **self.adamw.state}

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:  # evaluated once, for both halves
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError("not a Muon + AdamW optimizer state (expected the keys 'muon' and 'adamw')")
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])

    def __repr__(self) -> str:
        return f"MuonWithAdamW(\n{self.muon!r},\n{self.adamw!r})"
