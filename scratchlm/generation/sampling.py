"""Choosing the next token from the model's scores: pure functions of logits (B, V).

    logits (B, V) -> repetition penalty -> temperature -> top-k -> top-p -> min-p   (each optional)
                  -> greedy argmax, or one draw per row from the softmax           -> next ids (B,)

Every stage is a pure function of its inputs (plus an explicit `torch.Generator` for the draw),
so each can be tested and reused on its own; `choose_next` runs the whole pipeline for one step.
The sampler is written here from scratch, as the tutorials do it: it is one of the stations.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

# the options record and its checks are torch-free, so the command line's parser can read them
from scratchlm.generation.options import (  # noqa: F401 - part of this module's API
    MAX_NEW_TOKENS_LIMIT, SamplingOptions, check_length_penalty, check_max_new_tokens, check_seed,
)

def apply_repetition_penalty(logits: torch.Tensor, previous: torch.Tensor, penalty: float) -> torch.Tensor:
    """Make tokens already in `previous` (B, T) less likely (CTRL-style): logits (B, V) -> (B, V).

    A positive score is divided by `penalty` and a negative one multiplied by it, so penalty > 1
    always pushes a seen token down (dividing a negative score would push it up). 1.0 is a no-op.
    """
    if penalty == 1.0 or previous.numel() == 0:
        return logits
    seen = logits.gather(1, previous)  # (B, T) the score of every token already present
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, previous, seen)  # repeats write the same value, so order is harmless


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T: T < 1 sharpens the distribution, T > 1 flattens it. T must be > 0 here;
    T = 0 means greedy and is handled by `choose_next`."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0 to scale logits; 0 means greedy (use argmax)")
    return logits if temperature == 1.0 else logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest scores of each row (ties with the k-th are kept too); the rest -> -inf."""
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1) the k-th largest score
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most probable tokens whose probabilities sum to
    at least p; the rest -> -inf. The most probable token is always kept, so no row is empty.

    A token stays if the probability mass strictly above it (in descending order) is still < p.
    """
    if p >= 1.0:
        return logits
    probs = F.softmax(logits.float(), dim=-1)
    # Only the k most probable tokens need sorting, for any k whose tokens hold at least p in
    # every row: all the others have at least that much mass ranked above them. Sorting a whole
    # GPT-2 vocabulary costs most of a decoding step; a few hundred scores almost nothing
    # (benchmarks/measurements.md).
    def holds(floor: float) -> bool:  # the tokens at or above `floor` hold p in every row
        return bool((torch.where(probs >= floor, probs, 0.0).sum(dim=-1) >= p + 1e-5).all())  # margin: rounding

    floor = next((f for f in TOP_P_FLOORS if holds(f)), None)
    k = logits.shape[-1] if floor is None else max(1, int((probs >= floor).sum(dim=-1).max()))
    # ranked by score, not probability: scores a hair apart can round to the same probability
    order = torch.topk(logits, k, dim=-1).indices  # (B, k), most probable first
    top = probs.gather(-1, order)
    mass_before = torch.cumsum(top, dim=-1) - top  # mass of the tokens ranked above each
    keep_sorted = mass_before < p
    keep_sorted[..., 0] = True  # the top token is kept whatever p is
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, keep_sorted)  # vocabulary order
    return logits.masked_fill(~keep, float("-inf"))


TOP_P_FLOORS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
"""Probabilities tried in turn by top_p_filter: the first whose tokens hold p sets how many to sort."""


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the top token's; the rest -> -inf.

    The cut scales with the model's confidence: strict when one token dominates, loose when many
    are close. In log space: keep logit >= max logit + log(min_p).
    """
    if min_p <= 0.0:
        return logits
    top = logits.max(dim=-1, keepdim=True).values  # (B, 1)
    return logits.masked_fill(logits < top + math.log(min_p), float("-inf"))


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The most likely id of each row: logits (B, V) -> ids (B,), the first of equal maxima.

    On a CPU through NumPy, whose argmax over a GPT-2 row is several times faster than torch's,
    which would otherwise be a visible share of a decoding step (benchmarks/measurements.md)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and not logits.requires_grad:
        return torch.from_numpy(np.ascontiguousarray(logits.numpy()).argmax(axis=-1).astype(np.int64))
    return logits.argmax(dim=-1)


def sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One multinomial draw per row from softmax(logits) (B, V) -> ids (B,).

    By inverting the cumulative distribution: lay the probabilities end to end on [0, total),
    draw u uniformly there, and take the token whose stretch holds u (the first whose running
    total exceeds it). A token of probability q owns a stretch of length q, so it is drawn with
    probability q; a filtered-out token (probability 0) owns none. The running sums are float64,
    so 50k of them lose nothing visible. One uniform per row: a small fraction of what
    torch.multinomial costs, which was a fifth of a decoding step (benchmarks/measurements.md)."""
    probs = F.softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    running = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # (B, V)
    total = running[:, -1:]  # (B, 1), 1 up to rounding
    if not bool(torch.isfinite(total).all()):
        raise ValueError("cannot sample: the scores contain NaN, or every one of them is -inf")
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=logits.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u < total, even after rounding
    return torch.searchsorted(running, u, right=True).squeeze(-1)  # first index with running > u


def choose_next(
    logits: torch.Tensor,
    previous: torch.Tensor | None = None,
    options: SamplingOptions | None = None,
    *,
    generator: torch.Generator | None = None,
    **fields,
) -> torch.Tensor:
    """The whole pipeline for one step: logits (B, V) and the ids so far (B, T) -> next ids (B,).

    Greedy (or temperature 0) takes the argmax after the repetition penalty; the filters only
    reshape a distribution to sample from, and cannot change which token is the most likely.

    After top-k, the later stages work on the k candidates alone (B, k) when no other token ties
    with the k-th: every other token is -inf by then, so top-p, min-p and the draw give the same
    distribution, and 200 scores cost far less than 50,257.

    The settings come as a SamplingOptions, or as its fields by keyword (temperature=0.8, ...).
    """
    o = SamplingOptions.of(options, **fields)
    top_k, top_p, min_p = o.top_k, o.top_p, o.min_p
    if previous is not None:
        logits = apply_repetition_penalty(logits, previous, o.repetition_penalty)
    if o.is_greedy:
        return greedy_ids(logits)
    logits = apply_temperature(logits, o.temperature)
    candidates = None  # (B, k) vocabulary ids of the columns of `logits`, once narrowed to them
    if top_k is not None and top_k < logits.shape[-1]:
        top, ids = torch.topk(logits, top_k, dim=-1)  # (B, k) each
        if bool(((logits >= top[..., -1:]).sum(dim=-1) <= top_k).all()):  # no tie beyond the k-th
            logits, candidates = top, ids
        else:
            logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    if min_p is not None:
        logits = min_p_filter(logits, min_p)
    drawn = sample(logits, generator)
    return drawn if candidates is None else candidates.gather(-1, drawn[:, None]).squeeze(-1)


def sampling_probs(logits: torch.Tensor, previous: torch.Tensor | None = None, options: SamplingOptions | None = None,
                   **fields) -> torch.Tensor:
    """The distribution `choose_next` draws from, to show it: logits (B, V) -> probabilities (B, V),
    float64, after the repetition penalty, temperature, top-k, top-p and min-p; a filtered token
    has exactly 0. Greedy puts all of it on the token greedy takes."""
    o = SamplingOptions.of(options, **fields)
    if previous is not None:
        logits = apply_repetition_penalty(logits, previous, o.repetition_penalty)
    if o.is_greedy:
        return F.one_hot(greedy_ids(logits), logits.shape[-1]).double()
    logits = apply_temperature(logits, o.temperature)
    if o.top_k is not None:
        logits = top_k_filter(logits, o.top_k)
    if o.top_p is not None:
        logits = top_p_filter(logits, o.top_p)
    if o.min_p is not None:
        logits = min_p_filter(logits, o.min_p)
    return F.softmax(logits.double(), dim=-1)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A random stream of its own, so one seed gives one output whatever else uses torch's RNG."""
    check_seed(seed)
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # fresh entropy
    else:
        generator.manual_seed(int(seed))
    return generator
