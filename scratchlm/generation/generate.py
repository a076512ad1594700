"""Generation: turning a trained model into text, one token at a time (stations 18-20).

The loop (station 19): crop the sequence to the last `block_size` tokens, run the model, take the last
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

The pieces live in four modules, imported one way (generate -> decoding -> kernels):
scratchlm.generation.sampling chooses each token from the scores (pure functions), scratchlm.generation.text_rows turns
each sample's ids into text (stop strings, printable pieces), scratchlm.generation.decoding owns
the decoding copy of a model that computes them fast on a CPU (and its compiled step), and this
module runs the loops: plain, cached, beam, and the text-level `generate` and `stream`. Greedy
decoding runs up to GREEDY_CHUNK compiled steps per call.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import torch
import torch.nn.functional as F

from scratchlm.generation.decoding import Decoder, decoder_for
from scratchlm.errors import ConfigError, UserError
from scratchlm.machine.memory import check_generation_fits
from scratchlm.model.gpt import GPT, KVCache, eval_mode
from scratchlm.generation.sampling import (SamplingOptions, check_length_penalty, check_max_new_tokens, check_seed, choose_next,
                                make_generator)
from scratchlm.generation.text_rows import IncrementalText, TextRow


GREEDY_CHUNK = 8
"""The most greedy steps per call of the compiled step. Each call streams the whole model through
the caches, so whatever Python runs between two calls finds its data evicted and runs many times
slower than usual (benchmarks/measurements.md): paid once per chunk instead of once per token.
A consumer that stops early (an end token, a stop string) leaves at most GREEDY_CHUNK - 1 steps
computed and unused."""

GREEDY_LATENCY = 0.05
"""Seconds of steps one chunk may hold back from a streaming reader: a model whose step takes
longer than GREEDY_LATENCY / GREEDY_CHUNK gets shorter chunks (one step each past 50 ms a step,
where the Python between calls is nothing anyway), so its tokens still arrive one by one."""



@torch.inference_mode()
def iter_tokens(
    model: GPT | Decoder,
    idx: torch.Tensor,
    *,
    max_new_tokens: int = 100,
    sampling: SamplingOptions | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    dtype: torch.dtype | str | None = None,
    vocab: int | None = None,
    **options,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (next ids (B,), the model's raw logits (B, V) they were chosen from), step by step.

    idx (B, T0) holds the prompts, T0 >= 1 (start from BOS for an empty prompt). The model runs
    in eval mode (no dropout) and is put back in its former mode when the iterator ends. How each
    token is chosen: `sampling=SamplingOptions(...)`, or its fields as keywords (temperature=0.8,
    top_k=40, greedy=True, ...), as for every function here. vocab=N lets only ids below N be
    chosen (and yields those N scores): a tokenizer smaller than the model's padded vocabulary has
    no text for the rest.

    use_cache=False is the plain loop of station 19: every step runs the whole window, the last
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
    sampling = SamplingOptions.of(sampling, **options)
    check_max_new_tokens(max_new_tokens)
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must be (B, T) with T >= 1 (start an empty prompt from BOS), got {tuple(idx.shape)}")
    decoder = decoder_for(model, max_new_tokens, dtype)
    device, dtype = decoder.device_dtype
    B, T0 = idx.shape
    # One buffer for the whole sequence, written in place: no concatenation per step.
    seq = torch.empty(B, T0 + max_new_tokens, dtype=torch.long, device=device)
    seq[:, :T0] = idx
    n = T0
    penalise = sampling.repetition_penalty != 1.0
    cache = KVCache(decoder.model.config, B, device=device, dtype=dtype) if use_cache else None
    cut = vocab is not None and vocab < decoder.model.config.vocab_size
    chunks = _GreedyChunks(decoder) if sampling.is_greedy and not (penalise or cut) and cache is not None else None
    with eval_mode(decoder.model):
        while n < seq.shape[1]:
            chunk = chunks.run(seq[:, :n], cache, seq.shape[1] - n) if chunks is not None else None
            if chunk is None:  # one step: the scores, then the choice
                logits = _next_logits(decoder, seq[:, :n], cache)
                logits = logits[:, :vocab] if cut else logits
                next_ids = choose_next(logits, seq[:, :n] if penalise else None, sampling, generator=generator)
                chunk = next_ids[None], logits[None]
            for next_ids, logits in zip(*chunk):
                seq[:, n] = next_ids
                n += 1
                yield next_ids, logits


def _next_logits(decoder: Decoder, seq: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """Scores of the token after seq (B, n), the sequences so far (see iter_tokens): without a
    cache, the window (the last block_size tokens) run whole; with one, only the newest token
    against it, except into an empty cache (the prefill) or a full one, which starts over in the
    same tensors with the window that has just slid."""
    block = decoder.model.config.block_size
    if cache is not None and 0 < cache.length < block:
        return decoder.last_logits(seq[:, -1:], cache)
    if cache is not None:
        cache.length = 0
    return decoder.last_logits(seq[:, -block:], cache)


class _GreedyChunks:
    """Greedy steps of the compiled step, several per call (Decoder.greedy_steps): one step first,
    to time it, then as many as fit in GREEDY_LATENCY at the last chunk's pace, at most
    GREEDY_CHUNK, and never past the context's edge (a prefill or a sliding window goes the usual
    way). Once the step declines (more sequences than it takes, no compiled step), it is not
    asked again."""

    def __init__(self, decoder: Decoder):
        self.decoder = decoder
        self.per_step: float | None = None  # seconds one step took in the last chunk
        self.declined = False

    def run(self, seq: torch.Tensor, cache: KVCache, most: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(ids (S, B), logits (S, B, V)) of the next S <= `most` greedy steps after seq (B, n),
        or None: this step goes the usual way."""
        room = self.decoder.model.config.block_size - cache.length
        if self.declined or cache.length == 0 or room <= 0:
            return None
        size = 1 if self.per_step is None else int(GREEDY_LATENCY / max(self.per_step, 1e-9))
        size = max(1, min(size, GREEDY_CHUNK, most, room))
        start = time.perf_counter()
        chunk = self.decoder.greedy_steps(seq[:, -1:], size, cache)
        self.per_step = (time.perf_counter() - start) / size
        self.declined = chunk is None
        return chunk


def generate_ids(model: GPT | Decoder, idx: torch.Tensor, *, max_new_tokens: int = 100,
                 sampling: SamplingOptions | None = None, generator: torch.Generator | None = None,
                 seed: int | None = None, use_cache: bool = True, eos_id: int | None = None,
                 dtype: torch.dtype | str | None = None, **options) -> torch.Tensor:
    """ids (B, T0) -> (B, T0 + n) with the n <= max_new_tokens chosen tokens appended.

    With eos_id, a row that produced it keeps eos_id for its remaining positions, and the loop
    stops once every row has. `seed` builds a generator when none is given.
    """
    sampling = SamplingOptions.of(sampling, **options)
    check_max_new_tokens(max_new_tokens)
    decoder = decoder_for(model, max_new_tokens, dtype)
    device, _ = decoder.device_dtype
    if generator is None and not sampling.is_greedy:
        generator = make_generator(seed, device)
    idx = idx.to(device)
    steps = []
    done = torch.zeros(idx.shape[0], dtype=torch.bool, device=device) if eos_id is not None else None
    for next_ids, _ in iter_tokens(decoder, idx, max_new_tokens=max_new_tokens, sampling=sampling,
                                   generator=generator, use_cache=use_cache):
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


class Stopped(Exception):
    """A search abandoned because its caller's should_stop said so (a reader went away)."""


def _length_normalised(logprob: float, n_tokens: int, length_penalty: float) -> float:
    # Dividing by length^alpha stops the sum of (negative) log-probabilities from always
    # preferring short sequences; alpha = 0 ranks by the raw sum.
    return logprob / (max(n_tokens, 1) ** length_penalty)


def _one_prompt(idx: torch.Tensor) -> torch.Tensor:
    """The prompt of a beam search as (T0,): from (T0,) or (1, T0), not empty."""
    if idx.dim() == 2:
        if idx.shape[0] != 1:
            raise ValueError(f"beam search takes one prompt, got a batch of {idx.shape[0]}")
        idx = idx[0]
    if idx.numel() == 0:
        raise ValueError("the prompt is empty; start it from BOS")
    return idx


def _live_ranks(beams: torch.Tensor, top_scores: torch.Tensor, origin: torch.Tensor, token: torch.Tensor,
                beam_width: int, eos_id: int | None, finished: list[tuple[list[int], float]]) -> list[int]:
    """The ranks (best first) of the candidate extensions that stay live, at most beam_width; a
    candidate ending in eos_id leaves the search into `finished` when it ranks among the first
    beam_width (a finished beam must have beaten the live ones)."""
    keep: list[int] = []
    for rank in range(len(top_scores)):
        if eos_id is not None and int(token[rank]) == eos_id:
            if rank < beam_width:
                finished.append((beams[origin[rank]].tolist() + [eos_id], float(top_scores[rank])))
            continue
        keep.append(rank)
        if len(keep) == beam_width:
            break
    return keep


def _extend_beams(beams: torch.Tensor, scores: torch.Tensor, logp: torch.Tensor, beam_width: int, eos_id: int | None,
                  finished: list[tuple[list[int], float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One step of beam search: the live beams (W_live, n) with their scores, extended by one
    token each from logp (W_live, V), become the beam_width best live extensions; ranked
    extensions that end at eos_id go to `finished` (see _live_ranks). Returns (beams, scores,
    parents: each new beam's old row), with parents None when no live beam is left."""
    V = logp.shape[-1]
    candidates = (scores[:, None] + logp).view(-1)  # (W_live * V,) every one-token extension
    # with eos up to beam_width candidates may finish: look at twice as many to keep beam_width live
    k = min(candidates.numel(), beam_width * (2 if eos_id is not None else 1))
    top_scores, flat = candidates.topk(k)
    origin, token = flat // V, flat % V
    keep = _live_ranks(beams, top_scores, origin, token, beam_width, eos_id, finished)
    if not keep:
        return beams[:0], scores[:0], None
    keep_t = torch.tensor(keep, device=beams.device)
    parents = origin[keep_t]
    return torch.cat([beams[parents], token[keep_t, None]], dim=1), top_scores[keep_t], parents  # (W_live, n + 1)


@torch.inference_mode()
def beam_search(
    model: GPT | Decoder,
    idx: torch.Tensor,
    beam_width: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    n_best: int = 1,
    *,
    eos_id: int | None = None,
    use_cache: bool = True,
    dtype: torch.dtype | str | None = None,
    vocab: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[tuple[list[int], float]]:
    """Keep the `beam_width` most probable continuations at every step; return the `n_best`.

    idx: one prompt, (T0,) or (1, T0). Returns up to n_best pairs (ids, logprob), best first:
    ids is the whole sequence (prompt + continuation, ending with eos_id when the beam stopped
    there) and logprob the sum of log p(token | everything before) over the continuation. They
    are ranked by logprob / n_new^length_penalty. Finished beams (ended at eos_id) leave the
    search; the others run for max_new_tokens steps. A beam as wide as the number of possible
    continuations prunes nothing and is an exhaustive search. vocab=N: only ids below N extend a
    beam (see iter_tokens). should_stop, asked before each step: True abandons the search (Stopped).
    """
    check_max_new_tokens(max_new_tokens)
    if beam_width < 1 or n_best < 1:
        raise ConfigError("beams", f"beam width and n_best must be >= 1, got {beam_width} and {n_best}")
    check_length_penalty(length_penalty)
    idx = _one_prompt(idx)
    decoder = decoder_for(model, max_new_tokens, dtype)
    device, dtype = decoder.device_dtype
    T0 = idx.numel()

    beams = idx.to(device).view(1, T0)  # (W_live, T) live beams; one to start with
    scores = torch.zeros(1, device=device)  # (W_live,) log-probability of each continuation
    finished: list[tuple[list[int], float]] = []
    cache = KVCache(decoder.model.config, 1, device=device, dtype=dtype) if use_cache else None
    with eval_mode(decoder.model):
        for _ in range(max_new_tokens):
            if should_stop is not None and should_stop():
                raise Stopped("the beam search was stopped")
            logits = _next_logits(decoder, beams, cache)
            logp = F.log_softmax(logits[:, :vocab].float(), dim=-1)  # (W_live, V)
            beams, scores, parents = _extend_beams(beams, scores, logp, beam_width, eos_id, finished)
            if parents is None:
                break
            if cache is not None:
                # each surviving beam inherits its parent's keys and values
                cache.k = cache.k.index_select(1, parents)  # (N, W_live, H, block, hs)
                cache.v = cache.v.index_select(1, parents)

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


def _run_rows(
    model: GPT, tokenizer, start_ids: list[int], num_samples: int, stop: Sequence[str] | None,
    seed: int | None, use_cache: bool, max_new_tokens: int, sampling: SamplingOptions,
    dtype: torch.dtype | str | None = None,
) -> Iterator[list[TextRow]]:
    """Sample `num_samples` continuations of one prompt in one batch. Yield (the rows, the ids
    chosen (S,), the raw logits (S, V) they were chosen from) after every step, the step that
    ends the last row included, and once more, (rows, None, None), after they are all finished."""
    decoder = decoder_for(model, max_new_tokens, dtype)
    device, _ = decoder.device_dtype
    eos_id = getattr(tokenizer, "eos_id", None)
    rows = [TextRow(tokenizer, eos_id, _nonempty(stop)) for _ in range(num_samples)]
    idx = torch.tensor([start_ids] * num_samples, dtype=torch.long, device=device)  # (S, T0)
    generator = make_generator(seed, device)
    tokens = iter_tokens(decoder, idx, max_new_tokens=max_new_tokens, sampling=sampling, generator=generator,
                         use_cache=use_cache, vocab=getattr(tokenizer, "vocab_size", None))
    try:
        for next_ids, logits in tokens:
            for row, token in zip(rows, next_ids.tolist()):
                row.push(token)
            yield rows, next_ids, logits
            if all(row.reason is not None for row in rows):
                break
    finally:
        tokens.close()  # puts the model back in its former train/eval mode now, not at GC
    for row in rows:
        row.finish()
    yield rows, None, None


def _check_generate_options(num_samples: int, beams: int, max_new_tokens: int, seed: int | None,
                            length_penalty: float = 1.0) -> None:
    check_max_new_tokens(max_new_tokens)
    check_seed(seed)
    check_length_penalty(length_penalty)
    if isinstance(num_samples, bool) or not isinstance(num_samples, Integral) or num_samples < 1:
        raise ConfigError("num_samples", f"must be a whole number >= 1, got {num_samples!r}")
    if isinstance(beams, bool) or not isinstance(beams, Integral) or beams < 1:
        raise ConfigError("beams", f"must be a whole number >= 1, got {beams!r}")
    if beams > 1 and num_samples > beams:
        raise ConfigError("num_samples", f"beam search returns at most --beams={beams} sequences, asked for {num_samples}")


def _nonempty(stop: Sequence[str] | None) -> list[str]:
    return [s for s in (stop or []) if s]


def _beam_rows(model: GPT, tokenizer, start_ids: list[int], stops: list[str], beams: int, max_new_tokens: int,
               length_penalty: float, n_best: int, use_cache: bool, dtype: torch.dtype | str | None,
               should_stop: Callable[[], bool] | None) -> tuple[list[TextRow], list[float]]:
    """The n_best beams of beam_search as finished rows (their text cut at a stop string), and
    their log-probabilities."""
    eos_id = getattr(tokenizer, "eos_id", None)
    best = beam_search(model, torch.tensor(start_ids), beams, max_new_tokens, length_penalty, n_best=n_best,
                       eos_id=eos_id, use_cache=use_cache, dtype=dtype, vocab=getattr(tokenizer, "vocab_size", None),
                       should_stop=should_stop)
    rows = []
    for ids, _ in best:
        row = TextRow(tokenizer, eos_id, stops)
        for token in ids[len(start_ids) :]:
            row.push(token)
        row.finish()
        rows.append(row)
    return rows, [lp for _, lp in best]


def generate(
    model: GPT,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    sampling: SamplingOptions | None = None,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    use_cache: bool = True,
    num_samples: int = 1,
    beams: int = 1,
    length_penalty: float = 1.0,
    dtype: torch.dtype | str | None = None,
    should_stop: Callable[[], bool] | None = None,
    **options,
) -> GenerationResult:
    """Continue `prompt`; return the continuation's text and ids (see GenerationResult).

    Stops at the tokenizer's end-of-text token (eos_id), at the first of the `stop` strings (cut
    off before it), or after max_new_tokens. An empty prompt starts from BOS; a prompt longer than
    the context is cropped to its last block_size tokens with a warning. num_samples > 1 draws
    that many continuations in one batch. beams > 1 runs beam search and returns its
    num_samples best sequences (sampling options do not apply there). dtype (e.g. "bfloat16")
    decodes with a copy of the weights cast to it: half the bytes to read per token in bfloat16,
    at bfloat16's precision (see `decoding_model`). should_stop: see beam_search (beams only).
    """
    sampling = SamplingOptions.of(sampling, **options)
    _check_generate_options(num_samples, beams, max_new_tokens, seed, length_penalty)
    prompt_ids, start_ids, cropped = _encode_prompt(model, tokenizer, prompt)
    check_generation_fits(model.config, next(model.parameters()).device, beams if beams > 1 else num_samples,
                          max_new_tokens, len(start_ids))
    stops = _nonempty(stop)
    logprobs = None
    if beams > 1:
        rows, logprobs = _beam_rows(model, tokenizer, start_ids, stops, beams, max_new_tokens, length_penalty,
                                    num_samples, use_cache, dtype, should_stop)
    else:
        for rows, _, _ in _run_rows(model, tokenizer, start_ids, num_samples, stops, seed, use_cache, max_new_tokens,
                                    sampling, dtype):
            pass
    texts = [row.text for row in rows]
    all_ids = [row.ids for row in rows]
    return GenerationResult(
        text=texts[0], ids=all_ids[0], texts=texts, all_ids=all_ids,
        finish_reasons=[row.reason for row in rows], prompt_ids=prompt_ids, prompt_cropped=cropped,
        logprobs=logprobs,
    )


def stream(model: GPT, tokenizer, prompt: str, *, max_new_tokens: int = 100, sampling: SamplingOptions | None = None,
           seed: int | None = None, stop: Sequence[str] | None = None, use_cache: bool = True,
           dtype: torch.dtype | str | None = None, **options) -> Iterator[str]:
    """Like `generate` for one sample, but yield the text in pieces as soon as they are printable.

    The pieces join to exactly `generate(...).text` with the same options and seed. A multi-byte
    character split across tokens is held back until complete, and a tail that might begin a
    stop string until it is clear whether it does.
    """
    steps = stream_tokens(model, tokenizer, prompt, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                          stop=stop, use_cache=use_cache, dtype=dtype, **options)
    return (step.text for step in steps if step.text)


@dataclass
class TokenStep:
    """One step of `stream_tokens`: the token chosen, the text it made printable, and the scores."""

    id: int | None  # None for the last item, which only flushes text held back (see stream_tokens)
    text: str  # printable text released at this step: "" while a character is incomplete
    logits: torch.Tensor | None  # (V,) the model's raw scores this token was chosen from
    reason: str | None = None  # why the continuation ended, on the step that ended it: "eos" | "stop" | "length"


class TokenSteps(Iterator[TokenStep]):
    """What `stream_tokens` returns: iterate it for the steps. prompt_ids (the prompt as encoded)
    and cropped (whether the model starts from its last block_size ids only) are known before the
    first step."""

    def __init__(self, steps: Iterator[TokenStep], prompt_ids: list[int], cropped: bool):
        self._steps, self.prompt_ids, self.cropped = steps, prompt_ids, cropped

    def __next__(self) -> TokenStep:
        return next(self._steps)

    def close(self) -> None:
        """Stop early: the model goes back to the mode it was in."""
        self._steps.close()


def stream_tokens(model: GPT, tokenizer, prompt: str, *, max_new_tokens: int = 100,
                  sampling: SamplingOptions | None = None, seed: int | None = None, stop: Sequence[str] | None = None,
                  use_cache: bool = True, dtype: torch.dtype | str | None = None, **options) -> TokenSteps:
    """`stream` one token at a time: a TokenStep per token chosen (an end-of-text token too, with
    text ""), then one with id None holding whatever text was held back to the end. The texts join
    to exactly `generate(...).text` with the same options and seed; each step's logits are the
    scores its token was chosen from (softmax them for the model's probabilities)."""
    # Checked and encoded now, not at the first next(): errors and the crop warning come
    # before the caller prints anything.
    sampling = SamplingOptions.of(sampling, **options)
    _check_generate_options(1, 1, max_new_tokens, seed)
    prompt_ids, start_ids, cropped = _encode_prompt(model, tokenizer, prompt)
    stops = _nonempty(stop)
    rows = _run_rows(model, tokenizer, start_ids, 1, stops, seed, use_cache, max_new_tokens, sampling, dtype)
    return TokenSteps(_token_steps(rows, IncrementalText(stops)), prompt_ids, cropped)


def _token_steps(rows: Iterator[tuple[list[TextRow], torch.Tensor | None, torch.Tensor | None]],
                 printer: IncrementalText) -> Iterator[TokenStep]:
    for (row,), next_ids, logits in rows:
        piece = printer.piece(row.text, final=row.reason is not None)
        if next_ids is None:
            yield TokenStep(None, piece, None, row.reason)
        else:
            yield TokenStep(int(next_ids[0]), piece, logits[0], row.reason)
