"""The walkthrough's second half: from the logits of one tiny forward pass to one step of training
and to the next token. Each station is computed twice, by torch (the training path's own loss,
autograd, scratchlm's AdamW) and by the NumPy twin written out by hand
(scratchlm/reference/numpy_backward.py), with the largest difference between them:

    targets        y = the input shifted left by one: position t must predict token t + 1
    per-position   -log softmax(logits_t)[y_t]
    loss           their mean
    dlogits        (probs - onehot(y)) / T: where the gradient starts
    gradients      d loss / d W for every parameter (autograd beside the hand-written chain)
    AdamW          m, v, bias correction, the update, the new weights (torch.optim.AdamW beside adamw_step)
    next token     the last row of probs: its argmax (greedy) and a draw from it (sampling)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from scratchlm.inside.walkthrough import WalkStep, compare, for_display
from scratchlm.model.gpt import GPT

WALK_LR = 0.01
"""The walkthrough's AdamW learning rate: Adam's first step moves each weight by about lr (it is
the gradient's sign), so 0.01 shows at four decimals."""


@dataclass
class TrainingWalk:
    targets: list[int]
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    steps: list[WalkStep] = field(default_factory=list)  # torch beside NumPy
    numpy_only: dict[str, np.ndarray] = field(default_factory=dict)  # m_hat, v_hat, update: torch keeps none
    loss_after: float = float("nan")
    greedy: tuple[int, float] = (0, 0.0)  # (id, probability)
    sampled: tuple[int, float] = (0, 0.0)
    seed: int = 0

    @property
    def max_diff(self) -> float:
        return max(s.max_diff for s in self.steps)


def default_targets(ids: Sequence[int], vocab_size: int) -> list[int]:
    """The input shifted left by one; the last position's target (the token after the row) is not
    in the row, so it is taken as the next id after the last one (床前明 -> 前明月 with ids 0,1,2)."""
    return [*ids[1:], (ids[-1] + 1) % vocab_size]


def training_walk(model: GPT, ids: Sequence[int], targets: Sequence[int], *, lr: float = WALK_LR,
                  seed: int = 0) -> TrainingWalk:
    """Loss, backward pass, one AdamW step and the next token of `model` on one row, torch beside
    NumPy. The model itself takes the step (its weights change); pass a copy to keep it."""
    from scratchlm.training.optim import make_optimizer
    from scratchlm.reference import numpy_backward as back
    from scratchlm.reference.numpy_gpt import forward_trace, log_softmax, params_from_state_dict, sample_next
    from scratchlm.training.train_config import TrainConfig

    cfg = model.config
    if cfg.dropout:
        raise ValueError("the training walk compares torch with NumPy, which has no dropout; use dropout=0")
    ids, targets = [int(i) for i in ids], [int(t) for t in targets]
    if len(targets) != len(ids) or any(not 0 <= t < cfg.vocab_size for t in targets):
        raise ValueError(f"give {len(ids)} targets in 0..{cfg.vocab_size - 1}, one per input id, got {targets}")
    device = next(model.parameters()).device
    x, y = torch.tensor([ids], device=device), torch.tensor([targets], device=device)

    params = params_from_state_dict(model.state_dict())
    if cfg.tie_weights:
        params.pop("lm_head.weight")  # the twin reads a missing head as the tied table
    trace = forward_trace(np.array(ids), params, cfg)
    np_per_position = -log_softmax(trace["logits"])[np.arange(len(ids)), targets]
    np_grads = back.gpt_backward(trace, params, cfg, np.array(targets))

    train_cfg = TrainConfig(lr=lr)
    model.train()  # as training runs it (no dropout in the hand presets; asserted by the equality)
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y, return_logits=False)  # the training path (the plain head + loss at this size)
    with torch.no_grad():
        logits, _ = model(x)
        per_position = F.cross_entropy(logits[0], y[0], reduction="none")
        dlogits = (F.softmax(logits[0], dim=-1) - F.one_hot(y[0], cfg.vocab_size).to(logits.dtype)) / len(ids)
    loss.backward()
    named = dict(model.named_parameters())
    before = {n: p.detach().cpu().numpy().copy() for n, p in named.items()}
    grads = {n: p.grad.detach().cpu().numpy() for n, p in named.items()}
    optimizer = make_optimizer(model, train_cfg, device)
    optimizer.step()
    model.eval()

    walk = TrainingWalk(targets, lr, (train_cfg.beta1, train_cfg.beta2), optimizer.param_groups[0]["eps"],
                        train_cfg.weight_decay, seed=seed)
    add = walk.steps.append
    add(compare("per_position", "cross-entropy at each position: -log p(target)  (T,)", per_position, np_per_position))
    add(compare("loss", "loss = mean of the per-position cross-entropy  ()", loss, np_per_position.mean()))
    add(compare("dlogits", "d loss / d logits = (probs - onehot(targets)) / T  (T, V)", dlogits, trace["dlogits"]))
    np_shown = for_display(np_grads, cfg.n_embd)
    for shown, grad in for_display(grads, cfg.n_embd).items():
        add(compare("grad " + shown, f"d loss / d {shown}", grad, np_shown[shown]))
    _compare_adamw(walk, named, before, grads, optimizer)
    with torch.no_grad():
        walk.loss_after = float(model(x, y)[1])
    last = trace["probs"][-1]
    walk.greedy = (int(np.argmax(last)), float(last.max()))
    drawn = sample_next(trace["logits"][-1], np.random.default_rng(seed))
    walk.sampled = (drawn, float(last[drawn]))
    return walk

def _compare_adamw(walk: TrainingWalk, named: dict, before: dict, grads: dict, optimizer) -> None:
    """torch's AdamW state and new weights beside adamw_step's, parameter by parameter."""
    from scratchlm.reference import numpy_backward as back

    (beta1, beta2), lr = walk.betas, walk.lr
    for name, p in named.items():
        decay = walk.weight_decay if p.dim() >= 2 else 0.0  # matrices decay, vectors do not
        # fed torch's gradient: where a gradient is far below eps (1e-8), the step g / (|g| + eps)
        # magnifies its last bits by 1/eps, so the two gradients' 1e-18 differences would show
        zeros = np.zeros_like(before[name])
        out = back.adamw_step(before[name], grads[name], zeros, zeros, 1,
                              back.AdamWSettings(lr=lr, beta1=beta1, beta2=beta2, eps=walk.eps, weight_decay=decay))
        state = optimizer.state[p]
        for key, theirs in (("m", state["exp_avg"]), ("v", state["exp_avg_sq"]), ("param", p)):
            walk.steps.append(compare(f"adamw {key} {name}", "", theirs, out[key]))
        for key in ("m_hat", "v_hat", "update"):
            walk.numpy_only[f"{key} {name}"] = out[key]


def _label(i: int, labels: Sequence[str] | None) -> str:
    return f"{i} {labels[i]}" if labels else str(i)


def format_training(walk: TrainingWalk, ids: Sequence[int], labels: Sequence[str] | None = None) -> str:
    """The training half as text: torch (left) beside NumPy (right) at every station."""
    from scratchlm.inside.walkthrough import matrix_lines, side_by_side

    steps = {s.key: s for s in walk.steps}
    if list(walk.targets[:-1]) == list(ids[1:]):
        last = _label(walk.targets[-1], labels)
        lines = ["", "loss: position t learns to predict token t + 1, so the targets are the input shifted left by one;",
                 f"the last target, the token after the row, is not in the row: {last} here (the default is the last",
                 "id + 1; --targets sets your own):"]
    else:
        lines = ["", "loss: the targets given with --targets, one per position:"]
    lines += ["  input   " + ", ".join(_label(i, labels) for i in ids),
              "  targets " + ", ".join(_label(t, labels) for t in walk.targets)]
    for key in ("per_position", "loss", "dlogits"):
        s = steps[key]
        lines += ["", f"  {s.title}   max |torch - numpy| = {s.max_diff:.1e}", *side_by_side(s.torch, s.numpy)]
    lines += ["", "backward pass: the gradient of the loss for every parameter, torch autograd (left) and the NumPy",
              "chain rule written out by hand (right, scratchlm/reference/numpy_backward.py):"]
    for s in walk.steps:
        if s.key.startswith("grad "):
            lines += [f"  {s.title}   max diff {s.max_diff:.1e}", *side_by_side(s.torch, s.numpy, exact=True)]
    b1, b2 = walk.betas
    lines += ["", f"one AdamW step, step 1 (lr {walk.lr:g}, betas ({b1:g}, {b2:g}), eps {walk.eps:g}, weight decay "
              f"{walk.weight_decay:g} on matrices only), torch.optim.AdamW (left) beside adamw_step (right):",
              f"  m = (1 - {b1:g}) g, v = (1 - {b2:g}) g^2 (both start at 0); m_hat = m / (1 - {b1:g}^1), "
              f"v_hat = v / (1 - {b2:g}^1);",
              "  new = old (1 - lr decay) - lr m_hat / (sqrt(v_hat) + eps): about lr times the gradient's sign"]
    for s in walk.steps:
        if not s.key.startswith("adamw "):
            continue
        _, key, name = s.key.split(" ", 2)
        if key == "m":
            lines.append(f"  {name}")
        lines += [f"    {key if key != 'param' else 'new value'}   max diff {s.max_diff:.1e}",
                  *side_by_side(s.torch, s.numpy, indent="      ", exact=key != "param")]
        if key == "v":
            for extra in ("m_hat", "v_hat", "update"):
                lines += [f"    {extra} (NumPy)", *("      " + x for x in matrix_lines(walk.numpy_only[f'{extra} {name}'],
                                                                               exact=True))]
    loss = float(steps["loss"].numpy)
    (g, pg), (d, pd) = walk.greedy, walk.sampled
    lines += ["", f"loss after the step on the same row: {walk.loss_after:.6f} (before: {loss:.6f})",
              "", "next token, from the last row of probs (what the last position predicts):",
              f"  greedy (the argmax): {_label(g, labels)}  p = {pg:.4f}",
              f"  sampled (seed {walk.seed}, NumPy's sample_next): {_label(d, labels)}  p = {pd:.4f}",
              "", f"largest difference over the loss, gradients and AdamW step: {walk.max_diff:.3e}"]
    return "\n".join(lines)


def training_json(walk: TrainingWalk) -> dict[str, Any]:
    return {
        "targets": walk.targets, "lr": walk.lr, "betas": list(walk.betas), "eps": walk.eps,
        "weight_decay": walk.weight_decay,
        "steps": [{"key": s.key, "title": s.title, "torch": s.torch.tolist(), "numpy": s.numpy.tolist(),
                   "max_diff": s.max_diff} for s in walk.steps],
        "numpy_only": {k: v.tolist() for k, v in walk.numpy_only.items()},
        "loss_after": walk.loss_after,
        "next_token": {"greedy": {"id": walk.greedy[0], "p": walk.greedy[1]},
                       "sampled": {"id": walk.sampled[0], "p": walk.sampled[1], "seed": walk.seed}},
        "max_diff": walk.max_diff,
    }


def training_size(cfg, tokens: int) -> tuple[int, int]:
    """(lines, numbers on the widest row) that format_training prints, from the config alone."""
    from scratchlm.inside.walkthrough import for_display

    with torch.device("meta"):
        params = dict(GPT(cfg).named_parameters())
    rows = lambda shape: shape[0] if len(shape) == 2 else 1  # noqa: E731
    shown = for_display({n: np.empty(p.shape, dtype=np.int8) for n, p in params.items()}, cfg.n_embd)
    # the loss heading (three lines with the default targets, one with --targets), its three
    # stations, the backward heading
    lines = 6 + 6 + 2 + tokens + 3
    lines += sum(1 + rows(a.shape) for a in shown.values())
    lines += 4 + sum(1 + 6 * (1 + rows(p.shape)) for p in params.values()) + 8  # AdamW, then the tail
    widest = max([cfg.vocab_size, tokens] + [p.shape[-1] for p in params.values()])
    return lines, widest


def format_training_summary(walk: TrainingWalk, labels: Sequence[str], target_labels: Sequence[str]) -> str:
    """The training half of a real model in one line per station (its matrices are too big to
    print): the per-position losses in full, then each gradient's and each AdamW quantity's
    largest |torch - numpy|."""
    steps = {s.key: s for s in walk.steps}
    per = steps["per_position"]
    lines = ["", "loss: each position's input -> target, and -log p(target), torch | NumPy:"]
    lines += [f"  {a:<12} -> {b:<12} {x:.6f} | {y:.6f}" for a, b, x, y in zip(labels, target_labels, per.torch, per.numpy)]
    lines += [f"  loss (the mean) {float(steps['loss'].torch):.6f} | {float(steps['loss'].numpy):.6f}", "",
              f"backward pass and one AdamW step (lr {walk.lr:g}), largest |torch - numpy| per parameter:"]
    for s in walk.steps:
        if s.key.startswith("grad "):
            lines.append(f"  {s.key:<40} {str(tuple(s.torch.shape)):<12} {s.max_diff:.1e}")
    adamw: dict[str, float] = {}
    for s in walk.steps:  # m, v and the new value of each parameter: the largest of the three
        if s.key.startswith("adamw "):
            name = s.key.split(" ", 2)[2]
            adamw[name] = max(adamw.get(name, 0.0), s.max_diff)
    lines += [f"  adamw m, v, new {name:<31} {diff:.1e}" for name, diff in adamw.items()]
    lines += ["", f"loss after the step on the same row: {walk.loss_after:.6f}",
              f"largest difference over the loss, gradients and AdamW step: {walk.max_diff:.3e}"]
    return "\n".join(lines)
