"""The Engine: a model ready to generate, and the loops that run it (stations 19-20).

    engine = Engine(model, tokenizer, dtype="bfloat16")            # how the model runs
    engine.generate("Once upon", GenerationSettings.of(max_new_tokens=50, temperature=0.8, seed=1))

An Engine holds what stays the same from one generation to the next: the model, its tokenizer
(whose end-of-text id ends a continuation and whose vocabulary bounds the ids chosen), the dtype
it decodes in, whether it keeps a KV cache, and (through scratchlm.kernels.decoding_copy) the
decoding copy of the model. What one generation asks for comes with each call, as one
GenerationSettings (scratchlm.generation.settings).

The loop (station 19): crop the sequence to the last `block_size` tokens, run the model, take the
last position's scores (logits), choose a token (scratchlm.generation.sampling), append it, repeat.
The KV cache makes the loop cheaper without changing its result: the prompt is run once (prefill)
and every later step feeds only the newest token, reusing the keys and values of the earlier ones.
Past `block_size` the cache cannot stay exact (see `Engine.iter_tokens`), so the window is
recomputed, which is what the plain loop does anyway. Beam search keeps the `beams` most probable
partial sequences instead of one (scratchlm.generation.beam). Greedy decoding runs up to
GREEDY_CHUNK compiled steps per call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from scratchlm.errors import ConfigError, UserError
from scratchlm.generation.beam import Stopped, best_first, extend_beams, one_prompt
from scratchlm.kernels.decoding_copy import Decoder, decoder_for
from scratchlm.generation.sampling import choose_next, make_generator
from scratchlm.generation.settings import GenerationSettings
from scratchlm.generation.text_rows import (GenerationResult, IncrementalText, TextRow, TokenSteps, encode_prompt,
                                            token_steps)
from scratchlm.machine.memory import check_generation_fits
from scratchlm.model.gpt import GPT, KVCache, eval_mode

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

Rows = Iterator[tuple[list[TextRow], torch.Tensor | None, torch.Tensor | None]]


class Engine:
    """A model ready to generate (see the module docstring).

    model: a GPT, or a Decoder (scratchlm.kernels.decoding_copy), used as it is. tokenizer: needed
    for text in and out; its eos_id and vocab_size are the defaults of `eos_id` (a continuation
    ends there) and `vocab` (only ids below it are chosen: a tokenizer smaller than the model's
    padded vocabulary has no text for the rest). dtype (e.g. "bfloat16", "auto") decodes with a
    copy of the weights cast to it (see `decoding_model`; one copy per model and dtype, shared by
    every Engine on the model); use_cache=False runs the plain loop."""

    def __init__(self, model: GPT | Decoder, tokenizer=None, *, dtype: torch.dtype | str | None = None,
                 use_cache: bool = True, eos_id: int | None = None, vocab: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.use_cache = use_cache
        self.eos_id = getattr(tokenizer, "eos_id", None) if eos_id is None else eos_id
        self.vocab = getattr(tokenizer, "vocab_size", None) if vocab is None else vocab
        self.gpt = model.model if isinstance(model, Decoder) else model  # the GPT itself
        self.config = self.gpt.config

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return next(self.gpt.parameters()).device

    def decoder(self, steps: int) -> Decoder:
        """What `steps` steps run on: the model itself, or its decoding copy (see decoder_for)."""
        return decoder_for(self.model, steps, self.dtype)

    def _cache(self, decoder: Decoder, batch: int) -> KVCache | None:
        return new_cache(decoder, batch) if self.use_cache else None

    def iter_tokens(self, idx: torch.Tensor, settings: GenerationSettings | None = None, *,
                    generator: torch.Generator | None = None,
                    **fields) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (next ids (B,), the model's raw logits (B, V) they were chosen from), step by step.

        idx (B, T0) holds the prompts, T0 >= 1 (start from BOS for an empty prompt). The model runs
        in eval mode (no dropout) and is put back in its former mode when the iterator ends.
        generator: the draw's random stream (None: settings.seed's; torch's own when that is None
        too). With `vocab`, only ids below it are chosen, and those scores yielded.

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
        settings = GenerationSettings.of(settings, **fields)
        return token_loop(self.decoder(settings.max_new_tokens), idx, settings, generator, self.use_cache, self.vocab)

    def generate_ids(self, idx: torch.Tensor, settings: GenerationSettings | None = None, *,
                     generator: torch.Generator | None = None, **fields) -> torch.Tensor:
        """ids (B, T0) -> (B, T0 + n) with the n <= max_new_tokens chosen tokens appended.

        With `eos_id`, a row that produced it keeps eos_id for its remaining positions, and the
        loop stops once every row has. settings.seed builds the generator when none is given."""
        settings = GenerationSettings.of(settings, **fields)
        decoder = self.decoder(settings.max_new_tokens)
        device, _ = decoder.device_dtype
        if generator is None and not settings.sampling.is_greedy:
            generator = make_generator(settings.seed, device)
        idx = idx.to(device)
        steps = []
        eos_id = self.eos_id
        done = torch.zeros(idx.shape[0], dtype=torch.bool, device=device) if eos_id is not None else None
        for next_ids, _ in token_loop(decoder, idx, settings, generator, self.use_cache, self.vocab):
            if done is not None:
                next_ids = next_ids.masked_fill(done, eos_id)
                done |= next_ids == eos_id
            steps.append(next_ids)
            if done is not None and bool(done.all()):
                break
        if not steps:
            return idx.clone()
        return torch.cat([idx, torch.stack(steps, dim=1)], dim=1)  # (B, T0 + n)

    @torch.inference_mode()
    def beam_search(self, idx: torch.Tensor, settings: GenerationSettings | None = None, *,
                    should_stop: Callable[[], bool] | None = None, **fields) -> list[tuple[list[int], float]]:
        """Keep the `settings.beams` most probable continuations at every step; return the
        `settings.num_samples` best.

        idx: one prompt, (T0,) or (1, T0). Returns up to num_samples pairs (ids, logprob), best
        first: ids is the whole sequence (prompt + continuation, ending with eos_id when the beam
        stopped there) and logprob the sum of log p(token | everything before) over the
        continuation. They are ranked by logprob / n_new^length_penalty. Finished beams (ended at
        eos_id) leave the search; the others run for max_new_tokens steps. A beam as wide as the
        number of possible continuations prunes nothing and is an exhaustive search. Only ids
        below `vocab` extend a beam. should_stop, asked before each step: True abandons the
        search (Stopped). The sampling options do not apply."""
        settings = GenerationSettings.of(settings, **fields)
        idx = one_prompt(idx)
        decoder = self.decoder(settings.max_new_tokens)
        device, _ = decoder.device_dtype
        T0 = idx.numel()
        beams = idx.to(device).view(1, T0)  # (W_live, T) live beams; one to start with
        scores = torch.zeros(1, device=device)  # (W_live,) log-probability of each continuation
        finished: list[tuple[list[int], float]] = []
        cache = self._cache(decoder, 1)
        with eval_mode(decoder.model):
            for _ in range(settings.max_new_tokens):
                if should_stop is not None and should_stop():
                    raise Stopped("the beam search was stopped")
                logits = _next_logits(decoder, beams, cache)
                logp = F.log_softmax(logits[:, :self.vocab].float(), dim=-1)  # (W_live, V)
                beams, scores, parents = extend_beams(beams, scores, logp, settings.beams, self.eos_id, finished)
                if parents is None:
                    break
                if cache is not None:
                    # each surviving beam inherits its parent's keys and values
                    cache.k = cache.k.index_select(1, parents)  # (N, W_live, H, block, hs)
                    cache.v = cache.v.index_select(1, parents)
        finished += [(row.tolist(), float(s)) for row, s in zip(beams, scores)]
        return best_first(finished, T0, settings.length_penalty)[:settings.num_samples]

    def generate(self, prompt: str, settings: GenerationSettings | None = None, *,
                 should_stop: Callable[[], bool] | None = None, **fields) -> GenerationResult:
        """Continue `prompt`; return the continuation's text and ids (see GenerationResult).

        Stops at the tokenizer's end-of-text token (eos_id), at the first of the stop strings (cut
        off before it), or after max_new_tokens. An empty prompt starts from BOS; a prompt longer
        than the context is cropped to its last block_size tokens with a warning. num_samples > 1
        draws that many continuations in one batch. beams > 1 runs beam search and returns its
        num_samples best sequences (sampling options do not apply there). should_stop: see
        beam_search (beams only)."""
        settings = GenerationSettings.of(settings, **fields)
        prompt_ids, start_ids, cropped = encode_prompt(self.config, self.tokenizer, prompt)
        rows_at_once = settings.beams if settings.beams > 1 else settings.num_samples
        check_generation_fits(self.config, self.device, rows_at_once, settings.max_new_tokens, len(start_ids))
        if settings.beams > 1:
            best = self.beam_search(torch.tensor(start_ids), settings, should_stop=should_stop)
            n = len(start_ids)
            rows = [TextRow.finished(self.tokenizer, self.eos_id, settings.stop, ids[n:]) for ids, _ in best]
            return GenerationResult.of_rows(rows, prompt_ids, cropped, [lp for _, lp in best])
        for rows, _, _ in sample_rows(self, start_ids, settings):
            pass
        return GenerationResult.of_rows(rows, prompt_ids, cropped)

    def stream_tokens(self, prompt: str | Sequence[int], settings: GenerationSettings | None = None, *,
                      forced: Sequence[int] = (), **fields) -> TokenSteps:
        """`stream` one token at a time (`prompt`: text, or ids such as a chat template's prompt):
        a TokenStep per token chosen (an end-of-text token too,
        with text ""), then one with id None holding whatever text was held back to the end. The
        texts join to exactly `generate(...).text` with the same settings; each step's logits are
        the scores its token was chosen from (softmax them for the model's probabilities).
        forced: ids the first steps take instead of choosing (they count in max_new_tokens), to
        continue from a token the reader chose; their text and scores come as any step's."""
        # Checked and encoded now, not at the first next(): errors and the crop warning come
        # before the caller prints anything.
        settings = GenerationSettings.of(settings, **fields)
        for name in ("num_samples", "beams"):
            if getattr(settings, name) != 1:
                raise ConfigError(name, "a stream is one sampled continuation; use generate for more")
        prompt_ids, start_ids, cropped = encode_prompt(self.config, self.tokenizer, prompt)
        vocab = self.vocab or self.config.vocab_size
        bad = sorted({i for i in forced if not 0 <= i < vocab})
        if bad:
            raise UserError(f"forced ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
        steps = token_steps(sample_rows(self, start_ids, settings, forced), IncrementalText(settings.stop))
        return TokenSteps(steps, prompt_ids, cropped, start_ids)

    def stream(self, prompt: str, settings: GenerationSettings | None = None, **fields) -> Iterator[str]:
        """`generate`'s text for one sample, in pieces as soon as they are printable (joined, exactly
        that text); a character split across tokens, or a tail that may start a stop string, waits."""
        steps = self.stream_tokens(prompt, settings, **fields)
        return (step.text for step in steps if step.text)


def sample_rows(engine: Engine, start_ids: list[int], settings: GenerationSettings,
                forced: Sequence[int] = ()) -> Rows:
    """Sample settings.num_samples continuations of one prompt in one batch with `engine`. Yield
    (the rows, the ids chosen (S,), the raw logits (S, V) they were chosen from) after every step,
    the step that ends the last row included, and once more, (rows, None, None), after they are
    all finished. The first steps take the ids in `forced`, if any (see token_loop)."""
    decoder = engine.decoder(settings.max_new_tokens)
    device, _ = decoder.device_dtype
    rows = [TextRow(engine.tokenizer, engine.eos_id, settings.stop) for _ in range(settings.num_samples)]
    idx = torch.tensor([start_ids] * settings.num_samples, dtype=torch.long, device=device)  # (S, T0)
    tokens = token_loop(decoder, idx, settings, make_generator(settings.seed, device), engine.use_cache, engine.vocab,
                        forced)
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


def new_cache(decoder: Decoder, batch: int) -> KVCache:
    """An empty key/value cache for `batch` sequences, on the decoder's device and in its dtype."""
    device, dtype = decoder.device_dtype
    return KVCache(decoder.model.config, batch, device=device, dtype=dtype)


@torch.inference_mode()
def token_loop(decoder: Decoder, idx: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None,
               use_cache: bool, vocab: int | None, forced: Sequence[int] = ()) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Engine.iter_tokens's loop, on the decoder the caller already chose (one lookup per
    generation): a cache when use_cache, ids below `vocab` only. The first len(forced) steps take
    those ids instead of choosing (the scores are still computed and yielded, and no random
    number is drawn): a continuation from a token the reader chose."""
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must be (B, T) with T >= 1 (start an empty prompt from BOS), got {tuple(idx.shape)}")
    device, _ = decoder.device_dtype
    if generator is None and settings.seed is not None:
        generator = make_generator(settings.seed, device)
    B, T0 = idx.shape
    # One buffer for the whole sequence, written in place: no concatenation per step.
    seq = torch.empty(B, T0 + settings.max_new_tokens, dtype=torch.long, device=device)
    seq[:, :T0] = idx
    n = T0
    sampling = settings.sampling
    penalise = sampling.repetition_penalty != 1.0
    cache = new_cache(decoder, B) if use_cache else None
    cut = vocab is not None and vocab < decoder.model.config.vocab_size
    chunks = _GreedyChunks(decoder) if sampling.is_greedy and not (penalise or cut) and cache is not None else None
    with eval_mode(decoder.model):
        while n < seq.shape[1]:
            given = n - T0 < len(forced)
            chunk = chunks.run(seq[:, :n], cache, seq.shape[1] - n) if chunks is not None and not given else None
            if chunk is None:  # one step: the scores, then the choice
                logits = _next_logits(decoder, seq[:, :n], cache)
                logits = logits[:, :vocab] if cut else logits
                if given:
                    next_ids = torch.full((B,), forced[n - T0], dtype=torch.long, device=device)
                else:
                    next_ids = choose_next(logits, seq[:, :n] if penalise else None, sampling, generator=generator)
                chunk = next_ids[None], logits[None]
            for next_ids, logits in zip(*chunk):
                seq[:, n] = next_ids
                n += 1
                yield next_ids, logits


def _next_logits(decoder: Decoder, seq: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """Scores of the token after seq (B, n), the sequences so far (see Engine.iter_tokens):
    without a cache, the window (the last block_size tokens) run whole; with one, only the newest
    token against it, except into an empty cache (the prefill) or a full one, which starts over in
    the same tensors with the window that has just slid."""
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
