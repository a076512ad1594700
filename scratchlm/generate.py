"""Generation: turning a trained model into text, one token at a time (S20, S21).

The loop (S20): crop the sequence to the last `block_size` tokens, run the model, take the last
position's scores (logits), turn them into a distribution, choose a token, append it, repeat.

    ids (B, T) -> model -> logits (B, V) at the last position
               -> repetition penalty -> temperature -> top-k -> top-p -> min-p   (each optional)
               -> greedy argmax, or one multinomial draw per row                 -> next ids (B,)

Every step of that pipeline is a pure function of its inputs (plus an explicit
`torch.Generator` for the draw), so each can be tested and reused on its own.

The KV cache makes the loop cheaper without changing its result: the prompt is run once
(prefill) and every later step feeds only the newest token, reusing the keys and values of the
earlier ones. Past `block_size` the cache cannot stay exact (see `iter_tokens`), so the window is
recomputed, which is what the plain loop does anyway.

Beam search keeps the `beam_width` most probable partial sequences instead of one.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real

import torch
import torch.nn.functional as F

from scratchlm.errors import ConfigError, UserError
from scratchlm.model import GPT, KVCache

MAX_NEW_TOKENS_LIMIT = 100_000
"""The most new tokens one call may ask for: far beyond any sensible sample, small enough that a
typo (an extra zero or two) is refused instead of running for hours."""


# --------------------------------------------------------------------------------------------
# The sampling pipeline: pure functions of logits (B, V)
# --------------------------------------------------------------------------------------------


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
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V) each
    probs = F.softmax(sorted_logits.float(), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # (B, V) mass of the tokens ranked above
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False  # the top token is kept whatever p is
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the top token's; the rest -> -inf.

    The cut scales with the model's confidence: strict when one token dominates, loose when many
    are close. In log space: keep logit >= max logit + log(min_p).
    """
    if min_p <= 0.0:
        return logits
    top = logits.max(dim=-1, keepdim=True).values  # (B, 1)
    return logits.masked_fill(logits < top + math.log(min_p), float("-inf"))


def sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One multinomial draw per row from softmax(logits) (B, V) -> ids (B,)."""
    probs = F.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def choose_next(
    logits: torch.Tensor,
    previous: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The whole pipeline for one step: logits (B, V) and the ids so far (B, T) -> next ids (B,).

    Greedy (or temperature 0) takes the argmax after the repetition penalty; the filters only
    reshape a distribution to sample from, and cannot change which token is the most likely.
    """
    if previous is not None:
        logits = apply_repetition_penalty(logits, previous, repetition_penalty)
    if greedy or temperature == 0:
        return logits.argmax(dim=-1)
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    if min_p is not None:
        logits = min_p_filter(logits, min_p)
    return sample(logits, generator)


def check_sampling_options(
    *,
    max_new_tokens: int = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
) -> None:
    """Refuse values that have no meaning, naming the option (ConfigError is a UserError and a
    ValueError, so both the CLI and library callers can catch it)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral):
        raise ConfigError("max_new_tokens", f"must be a whole number, got {max_new_tokens!r}")
    if not 0 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise ConfigError("max_new_tokens", f"must be between 0 and {MAX_NEW_TOKENS_LIMIT}, got {max_new_tokens}")
    if not (isinstance(temperature, Real) and math.isfinite(temperature) and temperature >= 0):
        raise ConfigError("temperature", f"must be a finite number >= 0 (0 means greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, Integral) or top_k < 1):
        raise ConfigError("top_k", f"must be a whole number >= 1, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, Real) and 0.0 < top_p <= 1.0):
        raise ConfigError("top_p", f"must be in (0, 1], got {top_p!r}")
    if min_p is not None and not (isinstance(min_p, Real) and 0.0 <= min_p <= 1.0):
        raise ConfigError("min_p", f"must be in [0, 1], got {min_p!r}")
    if not (isinstance(repetition_penalty, Real) and math.isfinite(repetition_penalty) and repetition_penalty > 0):
        raise ConfigError("repetition_penalty", f"must be a finite number > 0 (1 disables it), got {repetition_penalty!r}")


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A random stream of its own, so one seed gives one output whatever else uses torch's RNG."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # fresh entropy
    else:
        generator.manual_seed(int(seed))
    return generator


# --------------------------------------------------------------------------------------------
# The decoding loop on tensors
# --------------------------------------------------------------------------------------------


def _last_logits(model: GPT, idx: torch.Tensor, kv_cache: KVCache | None = None, head=None) -> torch.Tensor:
    """ids (B, T) -> scores of the next token (B, V). Only the last position reaches lm_head:
    the same numbers as model(idx)[0][:, -1], without a (T, C) x (C, V) product thrown away."""
    hidden = model.forward_hidden(idx, kv_cache=kv_cache)  # (B, T, C)
    head = model.lm_head if head is None else head
    return head(hidden[:, -1, :])  # (B, V)


def _decoding_head(model: GPT, steps: int):
    """lm_head for one position per row, as fast as the device allows.

    lm_head is the largest matrix a decoding step reads (V x C: 39M of GPT-2's 124M weights).
    For a single row, CPU BLAS reads a (C, V) copy about twice as fast as nn.Linear's (V, C)
    layout, so on CPU a transposed copy is made once per call and reused every step. On GPUs
    both layouts are equally fast and the module is used as it is.
    """
    head = model.lm_head
    if head.weight.device.type != "cpu" or steps < 8:
        return head
    weight_t = head.weight.detach().t().contiguous()  # (C, V)
    if head.bias is None:
        return lambda h: h @ weight_t  # (B, C) @ (C, V) -> (B, V)
    bias = head.bias.detach()
    return lambda h: torch.addmm(bias, h, weight_t)  # bias + (B, C) @ (C, V)


def _model_device_dtype(model: GPT) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters())
    return param.device, param.dtype


@torch.inference_mode()
def iter_tokens(
    model: GPT,
    idx: torch.Tensor,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (next ids (B,), the model's raw logits (B, V) they were chosen from), step by step.

    idx (B, T0) holds the prompts, T0 >= 1 (start from BOS for an empty prompt). The model runs
    in eval mode (no dropout) and is put back in its former mode when the iterator ends.

    use_cache=False is the plain loop of S20: every step runs the whole window, the last
    `block_size` tokens. use_cache=True gives the same tokens:
      - the first step runs the window once and keeps every layer's keys and values (prefill);
      - each later step runs only the newest token against the cached keys and values;
      - once the cache holds `block_size` positions and the sequence grows again, the window
        slides by one. Every position in it then counts from a new start (learned, sinusoidal
        and RoPE positions are all absolute from the start of the window), and every hidden
        state attended to the token that just fell out, so no cached key or value is still the
        one the plain loop would compute. No cheaper scheme is exact: the step re-prefills the
        window, which costs what the plain loop costs. Until the boundary, a step costs one
        position instead of up to `block_size`.
    """
    check_sampling_options(
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, repetition_penalty=repetition_penalty,
    )
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must be (B, T) with T >= 1 (start an empty prompt from BOS), got {tuple(idx.shape)}")
    device, dtype = _model_device_dtype(model)
    block = model.config.block_size
    B, T0 = idx.shape
    # One buffer for the whole sequence, written in place: no concatenation per step.
    seq = torch.empty(B, T0 + max_new_tokens, dtype=torch.long, device=device)
    seq[:, :T0] = idx
    n = T0
    penalise = repetition_penalty != 1.0
    cache = KVCache(model.config, B, device=device, dtype=dtype) if use_cache else None
    head = _decoding_head(model, max_new_tokens)

    was_training = model.training
    model.eval()
    try:
        for step in range(max_new_tokens):
            if cache is None:
                logits = _last_logits(model, seq[:, max(0, n - block) : n], None, head)
            elif step == 0 or cache.length == block:
                cache.length = 0  # start over in the same preallocated tensors
                logits = _last_logits(model, seq[:, max(0, n - block) : n], cache, head)
            else:
                logits = _last_logits(model, seq[:, n - 1 : n], cache, head)
            next_ids = choose_next(
                logits, seq[:, :n] if penalise else None, temperature=temperature, top_k=top_k,
                top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty, greedy=greedy,
                generator=generator,
            )
            seq[:, n] = next_ids
            n += 1
            yield next_ids, logits
    finally:
        model.train(was_training)


def generate_ids(
    model: GPT,
    idx: torch.Tensor,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    eos_id: int | None = None,
) -> torch.Tensor:
    """ids (B, T0) -> (B, T0 + n) with the n <= max_new_tokens chosen tokens appended.

    With eos_id, a row that produced it keeps eos_id for its remaining positions, and the loop
    stops once every row has. `seed` builds a generator when none is given.
    """
    device, _ = _model_device_dtype(model)
    if generator is None and not greedy and temperature != 0:
        generator = make_generator(seed, device)
    idx = idx.to(device)
    steps = []
    done = torch.zeros(idx.shape[0], dtype=torch.bool, device=device) if eos_id is not None else None
    for next_ids, _ in iter_tokens(
        model, idx, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, repetition_penalty=repetition_penalty, greedy=greedy, generator=generator,
        use_cache=use_cache,
    ):
        if done is not None:
            next_ids = next_ids.masked_fill(done, eos_id)
            done |= next_ids == eos_id
        steps.append(next_ids)
        if done is not None and bool(done.all()):
            break
    if not steps:
        return idx.clone()
    return torch.cat([idx, torch.stack(steps, dim=1)], dim=1)  # (B, T0 + n)


# --------------------------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------------------------


def _length_normalised(logprob: float, n_tokens: int, length_penalty: float) -> float:
    # Dividing by length^alpha stops the sum of (negative) log-probabilities from always
    # preferring short sequences; alpha = 0 ranks by the raw sum.
    return logprob / (max(n_tokens, 1) ** length_penalty)


@torch.inference_mode()
def beam_search(
    model: GPT,
    idx: torch.Tensor,
    beam_width: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    n_best: int = 1,
    *,
    eos_id: int | None = None,
    use_cache: bool = True,
) -> list[tuple[list[int], float]]:
    """Keep the `beam_width` most probable continuations at every step; return the `n_best`.

    idx: one prompt, (T0,) or (1, T0). Returns up to n_best pairs (ids, logprob), best first:
    ids is the whole sequence (prompt + continuation, ending with eos_id when the beam stopped
    there) and logprob the sum of log p(token | everything before) over the continuation. They
    are ranked by logprob / n_new^length_penalty. Finished beams (ended at eos_id) leave the
    search; the others run for max_new_tokens steps. A beam as wide as the number of possible
    continuations prunes nothing and is an exhaustive search.
    """
    check_sampling_options(max_new_tokens=max_new_tokens)
    if beam_width < 1 or n_best < 1:
        raise ConfigError("beams", f"beam width and n_best must be >= 1, got {beam_width} and {n_best}")
    if idx.dim() == 2:
        if idx.shape[0] != 1:
            raise ValueError(f"beam search takes one prompt, got a batch of {idx.shape[0]}")
        idx = idx[0]
    if idx.numel() == 0:
        raise ValueError("the prompt is empty; start it from BOS")
    device, dtype = _model_device_dtype(model)
    block = model.config.block_size
    T0 = idx.numel()

    beams = idx.to(device).view(1, T0)  # (W_live, T) live beams; one to start with
    scores = torch.zeros(1, device=device)  # (W_live,) log-probability of each continuation
    finished: list[tuple[list[int], float]] = []
    cache = KVCache(model.config, 1, device=device, dtype=dtype) if use_cache else None
    head = _decoding_head(model, max_new_tokens)
    was_training = model.training
    model.eval()
    try:
        for step in range(max_new_tokens):
            n = beams.shape[1]
            if cache is None:
                logits = _last_logits(model, beams[:, max(0, n - block) :], None, head)
            elif step == 0 or cache.length == block:
                cache = KVCache(model.config, beams.shape[0], device=device, dtype=dtype)
                logits = _last_logits(model, beams[:, max(0, n - block) :], cache, head)
            else:
                logits = _last_logits(model, beams[:, -1:], cache, head)
            logp = F.log_softmax(logits.float(), dim=-1)  # (W_live, V)
            V = logp.shape[-1]
            candidates = (scores[:, None] + logp).view(-1)  # (W_live * V,) every one-token extension
            # With eos, up to beam_width candidates may finish, so look at twice as many to
            # still have beam_width live ones.
            k = min(candidates.numel(), beam_width * (2 if eos_id is not None else 1))
            top_scores, flat = candidates.topk(k)
            origin, token = flat // V, flat % V
            keep = []
            for rank in range(k):
                if eos_id is not None and int(token[rank]) == eos_id:
                    if rank < beam_width:  # a finished beam must have beaten the live ones
                        finished.append((beams[origin[rank]].tolist() + [eos_id], float(top_scores[rank])))
                    continue
                keep.append(rank)
                if len(keep) == beam_width:
                    break
            if not keep:
                beams = beams[:0]
                break
            keep_t = torch.tensor(keep, device=device)
            parents = origin[keep_t]
            beams = torch.cat([beams[parents], token[keep_t, None]], dim=1)  # (W_live, n + 1)
            scores = top_scores[keep_t]
            if cache is not None:
                # each surviving beam inherits its parent's keys and values
                cache.k = cache.k.index_select(1, parents)  # (N, W_live, H, block, hs)
                cache.v = cache.v.index_select(1, parents)
    finally:
        model.train(was_training)

    finished += [(row.tolist(), float(s)) for row, s in zip(beams, scores)]
    finished.sort(key=lambda pair: _length_normalised(pair[1], len(pair[0]) - T0, length_penalty), reverse=True)
    return finished[:n_best]


# --------------------------------------------------------------------------------------------
# Text in, text out
# --------------------------------------------------------------------------------------------


@dataclass
class GenerationResult:
    """What `generate` returns. `text` and `ids` are the first sample's continuation (the prompt
    is not repeated; an end-of-text token or stop string is not included)."""

    text: str
    ids: list[int]
    texts: list[str] = field(default_factory=list)  # every sample, in order
    all_ids: list[list[int]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)  # "length" | "eos" | "stop" per sample
    prompt_ids: list[int] = field(default_factory=list)  # as encoded, before any cropping
    prompt_cropped: bool = False  # the prompt was longer than the context; the model saw its tail
    logprobs: list[float] | None = None  # beam search: each sample's log-probability


def _ends_inside(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that could still grow into one of `stops`."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if s.startswith(text[-k:]):
                longest = k
                break
    return longest


class _Row:
    """One sample's continuation as it grows: its ids, its text, and whether and why it ended."""

    def __init__(self, tokenizer, eos_id: int | None, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.stops = list(stops)
        self.ids: list[int] = []
        self.reason: str | None = None  # None while running
        self._text: str | None = ""  # cached decode of self.ids; None when stale
        self._cut: int | None = None  # where a stop string begins

    def push(self, token: int) -> None:
        if self.reason is not None:
            return
        if self.eos_id is not None and token == self.eos_id:
            self.reason = "eos"
            return
        self.ids.append(token)
        self._text = None
        if self.stops:
            text = self.text
            hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
            if hits:
                # the text ends before the stop string; the ids keep the token that completed it
                self._cut = min(hits)
                self.reason = "stop"

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.tokenizer.decode(self.ids)
        return self._text if self._cut is None else self._text[: self._cut]

    def finish(self) -> None:
        if self.reason is None:
            self.reason = "length"


class IncrementalText:
    """Turns a growing list of token ids into printable pieces.

    Each call decodes the whole list and hands back only the new part that can no longer change:
    a trailing U+FFFD (bytes of a multi-byte character still to come) is held back, and so is a
    tail that may be the start of a stop string. `flush` hands back whatever is left.
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self.emitted = 0  # characters already handed out

    def piece(self, text: str, final: bool = False) -> str:
        stable = len(text)
        if not final:
            stable = len(text.rstrip("\ufffd"))
            stable -= _ends_inside(text[:stable], self.stops)
        if stable <= self.emitted:
            return ""
        out = text[self.emitted : stable]
        self.emitted = stable
        return out


def _encode_prompt(model: GPT, tokenizer, prompt: str) -> tuple[list[int], list[int], bool]:
    """(prompt ids as encoded, the ids the model starts from, whether they were cropped)."""
    ids = list(tokenizer.encode(prompt)) if prompt else []
    if not ids:
        bos = getattr(tokenizer, "bos_id", None)
        if bos is None:
            raise UserError("the prompt is empty and the tokenizer has no BOS token; give a prompt")
        ids = [bos]
    V = model.config.vocab_size
    bad = sorted({i for i in ids if not 0 <= i < V})
    if bad:
        raise UserError(
            f"the tokenizer produced ids {bad[:5]} outside the model's vocabulary (vocab_size={V}); "
            "use the tokenizer the model was trained with"
        )
    block = model.config.block_size
    cropped = len(ids) > block
    if cropped:
        warnings.warn(
            f"the prompt has {len(ids)} tokens but the model's context is {block}; "
            f"only its last {block} tokens are used",
            stacklevel=3,
        )
    return ids, ids[-block:] if cropped else ids, cropped


def _sampling_kwargs(options: dict) -> dict:
    return {k: options[k] for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "greedy")}


def _run_rows(
    model: GPT, tokenizer, start_ids: list[int], num_samples: int, stop: Sequence[str] | None,
    seed: int | None, use_cache: bool, max_new_tokens: int, sampling: dict,
) -> Iterator[list[_Row]]:
    """Sample `num_samples` continuations of one prompt in one batch; yield the rows after
    every step, and once more after they are all finished."""
    device, _ = _model_device_dtype(model)
    eos_id = getattr(tokenizer, "eos_id", None)
    rows = [_Row(tokenizer, eos_id, [s for s in (stop or []) if s]) for _ in range(num_samples)]
    idx = torch.tensor([start_ids] * num_samples, dtype=torch.long, device=device)  # (S, T0)
    generator = make_generator(seed, device)
    tokens = iter_tokens(model, idx, max_new_tokens=max_new_tokens, generator=generator, use_cache=use_cache, **sampling)
    try:
        for next_ids, _ in tokens:
            for row, token in zip(rows, next_ids.tolist()):
                row.push(token)
            if all(row.reason is not None for row in rows):
                break
            yield rows
    finally:
        tokens.close()  # puts the model back in its former train/eval mode now, not at GC
    for row in rows:
        row.finish()
    yield rows


def _check_generate_options(num_samples: int, beams: int, max_new_tokens: int, sampling: dict) -> None:
    check_sampling_options(max_new_tokens=max_new_tokens, **{k: v for k, v in sampling.items() if k != "greedy"})
    if isinstance(num_samples, bool) or not isinstance(num_samples, Integral) or num_samples < 1:
        raise ConfigError("num_samples", f"must be a whole number >= 1, got {num_samples!r}")
    if isinstance(beams, bool) or not isinstance(beams, Integral) or beams < 1:
        raise ConfigError("beams", f"must be a whole number >= 1, got {beams!r}")
    if beams > 1 and num_samples > beams:
        raise ConfigError("num_samples", f"beam search returns at most --beams={beams} sequences, asked for {num_samples}")


def generate(
    model: GPT,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    use_cache: bool = True,
    num_samples: int = 1,
    beams: int = 1,
    length_penalty: float = 1.0,
) -> GenerationResult:
    """Continue `prompt`; return the continuation's text and ids (see GenerationResult).

    Stops at the tokenizer's end-of-text token (eos_id), at the first of the `stop` strings (cut
    off before it), or after max_new_tokens. An empty prompt starts from BOS; a prompt longer than
    the context is cropped to its last block_size tokens with a warning. num_samples > 1 draws
    that many continuations in one batch. beams > 1 runs beam search and returns its
    num_samples best sequences (sampling options do not apply there).
    """
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repetition_penalty=repetition_penalty, greedy=greedy)
    _check_generate_options(num_samples, beams, max_new_tokens, sampling)
    prompt_ids, start_ids, cropped = _encode_prompt(model, tokenizer, prompt)
    stops = [s for s in (stop or []) if s]
    logprobs = None
    if beams > 1:
        eos_id = getattr(tokenizer, "eos_id", None)
        best = beam_search(
            model, torch.tensor(start_ids), beams, max_new_tokens, length_penalty, n_best=num_samples,
            eos_id=eos_id, use_cache=use_cache,
        )
        rows = []
        for ids, _ in best:
            row = _Row(tokenizer, eos_id, stops)
            for token in ids[len(start_ids) :]:
                row.push(token)
            row.finish()
            rows.append(row)
        logprobs = [lp for _, lp in best]
    else:
        for rows in _run_rows(model, tokenizer, start_ids, num_samples, stops, seed, use_cache, max_new_tokens, sampling):
            pass
    texts = [row.text for row in rows]
    all_ids = [row.ids for row in rows]
    return GenerationResult(
        text=texts[0], ids=all_ids[0], texts=texts, all_ids=all_ids,
        finish_reasons=[row.reason for row in rows], prompt_ids=prompt_ids, prompt_cropped=cropped,
        logprobs=logprobs,
    )


def stream(
    model: GPT,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    use_cache: bool = True,
) -> Iterator[str]:
    """Like `generate` for one sample, but yield the text in pieces as soon as they are printable.

    The pieces join to exactly `generate(...).text` with the same options and seed. A multi-byte
    character split across tokens is held back until complete, and a tail that might begin a
    stop string until it is clear whether it does.
    """
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repetition_penalty=repetition_penalty, greedy=greedy)
    # Checked and encoded now, not at the first next(): errors and the crop warning come
    # before the caller prints anything.
    _check_generate_options(1, 1, max_new_tokens, sampling)
    _, start_ids, _ = _encode_prompt(model, tokenizer, prompt)
    stops = [s for s in (stop or []) if s]
    rows = _run_rows(model, tokenizer, start_ids, 1, stops, seed, use_cache, max_new_tokens, sampling)
    return _printable_pieces(rows, IncrementalText(stops))


def _printable_pieces(rows: Iterator[list[_Row]], printer: IncrementalText) -> Iterator[str]:
    row = None
    for (row,) in rows:
        piece = printer.piece(row.text, final=row.reason is not None)
        if piece:
            yield piece
    if row is not None:
        piece = printer.piece(row.text, final=True)
        if piece:
            yield piece
