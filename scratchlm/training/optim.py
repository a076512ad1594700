"""Muon for the hidden matrices, AdamW for everything else, presented to the loop as one optimizer.

Muon (Keller Jordan, 2024; used by modded-nanogpt and nanochat) keeps a Nesterov momentum of each
weight matrix's gradient, like SGD, but before applying it replaces the momentum M = U S V^T by
(roughly) U V^T: the same directions with every singular value set near 1. A few large singular
directions can no longer dominate the step, so the rare directions learn as fast as the common
ones. torch.optim.Muon does the orthogonalisation with 5 iterations of a quintic Newton-Schulz
polynomial in bfloat16 (3 matmuls each), so each step costs extra compute per hidden matrix; it
pays off when it buys more loss per step than it costs in time per step.

`Muon` here is torch's with one knob added: the dtype of those iterations. torch always uses
bfloat16, which is right on GPUs and on CPUs with bfloat16 units (AVX512-BF16, AMX, aarch64
BF16), and slow where a bfloat16 matmul is emulated: there it costs more than a float32 one. `newton_schulz_dtype(device)` picks float32 there
(scratchlm.machine.cpu.native_bf16); with bfloat16 the step is torch's, operation for operation.

Muon is meant for the matrices *inside* the network. The token and position tables and lm_head
map to and from the vocabulary rather than between hidden features, and norm gains and biases are
vectors: these stay with AdamW, with the usual split (decay on matrices, none on vectors) of
`make_optimizer` (below).

Both halves read the same learning rate: torch's `adjust_lr_fn="match_rms_adamw"` scales Muon's
step by 0.2 * sqrt(max(rows, cols)), which makes its update's RMS about AdamW's (Moonshot's "Muon
is Scalable for LLM Training"), so one lr, one schedule and one weight decay serve both.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from scratchlm.machine import cpu
from scratchlm.training.train_config import TrainConfig


def newton_schulz_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where its matmuls are native (CUDA, CPUs with bfloat16 units), else float32."""
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu" and cpu.native_bf16():
        return torch.bfloat16
    return torch.float32


def orthogonalize(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration in `dtype`: X <- a X + (b A + c A^2) X with
    A = X X^T, on the wide orientation of g scaled to spectral norm at most 1 (by its Frobenius
    norm). For one matrix (rows, cols), the same operations in the same order as
    torch.optim.Muon's (there always bfloat16); a stack (n, rows, cols) is n matrices at once,
    each as alone (batched matmuls: n small products cost little more than one)."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    if x.dim() == 2:
        x = x.div(x.norm().clamp(min=eps))
        for _ in range(steps):
            gram = x @ x.T
            poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.addmm(x, poly, x, beta=a)
    else:
        x = x.div(x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps))
        for _ in range(steps):
            gram = x @ x.mT
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, poly, x, beta=a)
    return x.mT if tall else x


class Muon(torch.optim.Muon):
    """torch.optim.Muon with the Newton-Schulz iterations in `ns_dtype` (see the module's doc),
    and matrices of one shape orthogonalised together (a stack, `orthogonalize`): the baby GPT's
    16 matrices are 4 stacks. The dtype belongs to the machine, not to the run: it is not in the
    state dict, so a run resumed on another CPU uses that CPU's."""

    def __init__(self, params, *, ns_dtype: torch.dtype = torch.bfloat16, **options: Any):
        super().__init__(params, **options)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, decay, momentum = float(group["lr"]), group["weight_decay"], group["momentum"]
            by_shape: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                by_shape.setdefault((tuple(p.shape), p.device, p.dtype), []).append((p, update))
            for pairs in by_shape.values():
                options = (group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                if len(pairs) == 1:
                    updates = [orthogonalize(pairs[0][1], *options)]
                else:
                    updates = orthogonalize(torch.stack([u for _, u in pairs]), *options).unbind(0)
                for (p, _), update in zip(pairs, updates):
                    p.mul_(1 - lr * decay)
                    p.add_(update, alpha=-lr * _lr_ratio(group["adjust_lr_fn"], p.shape))
        return loss


def _lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's scaling of the step for a (rows, cols) matrix."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


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

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):  # scratchlm.training.optim.Muon or torch's
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


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig,
                   device: torch.device) -> torch.optim.AdamW | MuonWithAdamW:
    """AdamW with decay on matrices (every parameter of 2 or more dimensions) only.

    With cfg.optimizer == "muon": torch.optim.Muon on the blocks' matrices and this AdamW on the
    rest, as one scratchlm.training.optim.MuonWithAdamW (same lr, schedule and weight decay for both).
    """
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}  # a tied matrix appears once
    muon_params: list[torch.nn.Parameter] = []
    if cfg.optimizer == "muon":
        muon_params = hidden_matrices(model)
        taken = {id(p) for p in muon_params}
        params = {n: p for n, p in params.items() if id(p) not in taken}
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    extra: dict[str, Any] = {}
    if cfg.fsdp:
        extra["foreach"] = True  # sharded (DTensor) parameters: the foreach path supports them everywhere
    elif device.type in ("cuda", "cpu"):
        extra["fused"] = True  # one kernel for all parameters instead of one per tensor
    adamw = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **extra)
    if cfg.optimizer != "muon":
        return adamw
    muon = Muon(muon_params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                nesterov=True, adjust_lr_fn="match_rms_adamw", ns_dtype=newton_schulz_dtype(device))
    return MuonWithAdamW(muon, adamw)
