"""Generation: turning a trained model into text, one token at a time (stations 18-20).

    ids (B, T) -> model -> logits (B, V) at the last position
               -> repetition penalty -> temperature -> top-k -> top-p -> min-p   (each optional)
               -> greedy argmax, or one multinomial draw per row                 -> next ids (B,)

The entry points, one call each:

    generate(model, tokenizer, "Once upon", settings)        -> GenerationResult (text, ids, ...)
    stream(model, tokenizer, "Once upon", settings)          -> the text in printable pieces
    stream_tokens(model, tokenizer, "Once upon", settings)   -> a TokenStep per token (id, text, logits)
    generate_ids(model, idx, settings)                       -> idx (B, T0) with the new ids appended
    iter_tokens(model, idx, settings)                        -> (next ids (B,), logits (B, V)) per step
    beam_search(model, idx, settings)                        -> the best (ids, logprob) pairs

`settings` is a GenerationSettings (how many tokens, how each is chosen, the seed, stop strings,
samples, beams), or its fields and SamplingOptions' as keywords: `generate(model, tok, "hi",
max_new_tokens=20, temperature=0.8, seed=1)`. How the model runs (`dtype`, `use_cache`) is a
keyword of its own. Each call makes an Engine (scratchlm.generation.engine), which runs the loops;
a caller that generates many times, as the playground does, keeps one Engine instead.

The pieces live in these modules, imported one way (generate -> engine -> decoding -> kernels):
scratchlm.generation.settings (the settings record), sampling (choosing each token from the scores,
pure functions), beam (beam search's bookkeeping), text_rows (each sample's ids as text: stop
strings, printable pieces), decoding (the decoding copy of a model that computes the scores fast on
a CPU, and its compiled step), and engine (the loops: plain, cached, beam, and text in, text out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from scratchlm.generation.beam import Stopped
from scratchlm.kernels.decoding_copy import Decoder
from scratchlm.generation.engine import Engine
from scratchlm.generation.sampling import SamplingOptions
from scratchlm.generation.settings import GenerationSettings
from scratchlm.generation.text_rows import GenerationResult, IncrementalText, TokenStep, TokenSteps
from scratchlm.model.gpt import GPT

__all__ = ["Engine", "GenerationResult", "GenerationSettings", "IncrementalText", "SamplingOptions", "Stopped",
           "TokenStep", "TokenSteps", "beam_search", "generate", "generate_ids", "iter_tokens", "stream",
           "stream_tokens"]

Dtype = torch.dtype | str | None


def generate(model: GPT, tokenizer, prompt: str, settings: GenerationSettings | None = None, *, dtype: Dtype = None,
             use_cache: bool = True, should_stop: Callable[[], bool] | None = None, **fields) -> GenerationResult:
    """Continue `prompt` (see Engine.generate). dtype (e.g. "bfloat16") decodes with a copy of
    the weights cast to it: half the bytes to read per token in bfloat16, at bfloat16's precision
    (see `decoding_model`)."""
    engine = Engine(model, tokenizer, dtype=dtype, use_cache=use_cache)
    return engine.generate(prompt, GenerationSettings.of(settings, **fields), should_stop=should_stop)


def stream(model: GPT, tokenizer, prompt: str, settings: GenerationSettings | None = None, *, dtype: Dtype = None,
           use_cache: bool = True, **fields) -> Iterator[str]:
    """Like `generate` for one sample, but the text in pieces as soon as they are printable; they
    join to exactly `generate(...).text` with the same settings (see Engine.stream)."""
    return Engine(model, tokenizer, dtype=dtype, use_cache=use_cache).stream(prompt, settings, **fields)


def stream_tokens(model: GPT, tokenizer, prompt: str, settings: GenerationSettings | None = None, *,
                  dtype: Dtype = None, use_cache: bool = True, **fields) -> TokenSteps:
    """`stream` one token at a time, with each token's scores (see Engine.stream_tokens)."""
    return Engine(model, tokenizer, dtype=dtype, use_cache=use_cache).stream_tokens(prompt, settings, **fields)


def generate_ids(model: GPT | Decoder, idx: torch.Tensor, settings: GenerationSettings | None = None, *,
                 generator: torch.Generator | None = None, eos_id: int | None = None, dtype: Dtype = None,
                 use_cache: bool = True, **fields) -> torch.Tensor:
    """ids (B, T0) -> (B, T0 + n), n <= max_new_tokens; a row that produced eos_id keeps it to the
    end, and the loop stops once every row has (see Engine.generate_ids)."""
    engine = Engine(model, dtype=dtype, use_cache=use_cache, eos_id=eos_id)
    return engine.generate_ids(idx, settings, generator=generator, **fields)


def iter_tokens(model: GPT | Decoder, idx: torch.Tensor, settings: GenerationSettings | None = None, *,
                generator: torch.Generator | None = None, vocab: int | None = None, dtype: Dtype = None,
                use_cache: bool = True, **fields) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(next ids (B,), raw logits (B, V)) step by step after idx (B, T0); vocab=N chooses among
    the first N ids only (see Engine.iter_tokens)."""
    engine = Engine(model, dtype=dtype, use_cache=use_cache, vocab=vocab)
    return engine.iter_tokens(idx, settings, generator=generator, **fields)


def beam_search(model: GPT | Decoder, idx: torch.Tensor, settings: GenerationSettings | None = None, *,
                eos_id: int | None = None, vocab: int | None = None, dtype: Dtype = None, use_cache: bool = True,
                should_stop: Callable[[], bool] | None = None, **fields) -> list[tuple[list[int], float]]:
    """The settings.num_samples best of a beam search of width settings.beams from one prompt
    idx (T0,) or (1, T0), as (ids, logprob) pairs, best first (see Engine.beam_search)."""
    engine = Engine(model, dtype=dtype, use_cache=use_cache, eos_id=eos_id, vocab=vocab)
    return engine.beam_search(idx, settings, should_stop=should_stop, **fields)
