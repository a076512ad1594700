"""Beam search's bookkeeping, pure functions of tensors: extend every live beam by every token,
keep the `beam_width` best, let the ones that end at the end-of-text token leave the search, and
rank what is left. The loop that asks the model for each step's scores is Engine.beam_search
(scratchlm.generation.engine)."""

from __future__ import annotations

import torch


class Stopped(Exception):
    """A search abandoned because its caller's should_stop said so (a reader went away)."""


def length_normalised(logprob: float, n_tokens: int, length_penalty: float) -> float:
    # Dividing by length^alpha stops the sum of (negative) log-probabilities from always
    # preferring short sequences; alpha = 0 ranks by the raw sum.
    return logprob / (max(n_tokens, 1) ** length_penalty)


def one_prompt(idx: torch.Tensor) -> torch.Tensor:
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


def extend_beams(beams: torch.Tensor, scores: torch.Tensor, logp: torch.Tensor, beam_width: int, eos_id: int | None,
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


def best_first(sequences: list[tuple[list[int], float]], prompt_length: int,
               length_penalty: float) -> list[tuple[list[int], float]]:
    """(ids, logprob) pairs ranked by logprob / n_new^length_penalty, best first."""
    return sorted(sequences, key=lambda pair: length_normalised(pair[1], len(pair[0]) - prompt_length, length_penalty),
                  reverse=True)
