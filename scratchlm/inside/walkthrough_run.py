"""A trained run's model walked on a text: the walkthrough (scratchlm.inside.walkthrough) of a real
checkpoint rather than the hand-sized model. `scratchlm walkthrough --checkpoint RUN --text T` and
the playground's Inside tab (POST /api/walkthrough) both build the walk here, so the two agree.

The text is a training row, as the data pipeline writes every document: BOS, then the text's
ids; x = row[:-1] is the input and y = row[1:] the targets, so position t is asked for the
token at t + 1. The walk compares every station with the NumPy twin, which has no dropout: the
model walked has dropout off and runs in float64 on both sides (differences ~1e-15).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import torch

from scratchlm.errors import UserError
from scratchlm.inside.tokenize_view import piece_labels, visible
from scratchlm.inside.walkthrough import Walkthrough, walkthrough_json, walkthrough_of
from scratchlm.model.gpt import GPT

WALK_CHECKPOINT_MAX_TOKENS = 32
"""The longest input walked through a checkpoint: its (T, T) scores show one row per token."""


def walk_limit(model: GPT) -> int:
    """The most input tokens a walk of `model` takes: its context, and at most 32."""
    return min(model.config.block_size, WALK_CHECKPOINT_MAX_TOKENS)


def text_row(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """(x, y) of the training row BOS + tokenizer.encode(text): x = row[:-1], y = row[1:]. Both
    are empty for an empty text (the row is BOS alone)."""
    row = [tokenizer.bos_id, *tokenizer.encode(text)]
    return row[:-1], row[1:]


def walkable(model: GPT, *, in_place: bool = False) -> GPT:
    """`model` as the walk needs it: dropout off everywhere (its config too) and float64.

    By default a copy, and `model` stays as it is (the playground keeps generating with it);
    in_place=True changes `model` itself, for a caller that loaded it for this walk alone."""
    model = model if in_place else copy.deepcopy(model)  # the copy holds its own config
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "dropout", None), float):
            module.dropout = 0.0
    model.config.dropout = 0.0
    return model.double()


@dataclass
class RunWalk:
    """One walk of a run's model: the walkthrough, a label per input position, the five likeliest
    next tokens at the last position as (id, label, probability), and the float64 model walked
    (a training step on it leaves the caller's model alone unless the walk was in place)."""

    walk: Walkthrough
    labels: list[str]
    top: list[tuple[int, str, float]]
    model: GPT


def walk_run(model: GPT, tokenizer: Any, ids: Sequence[int], source: str, *, in_place: bool = False) -> RunWalk:
    """The walkthrough of a trained model on `ids` (checked by the caller: 1 to walk_limit ids of
    its vocabulary). `tokenizer` may be None: the labels are then the ids themselves."""
    model = walkable(model, in_place=in_place)
    ids = [int(i) for i in ids]
    labels = piece_labels(tokenizer, ids) if tokenizer is not None else [str(i) for i in ids]
    w = walkthrough_of(model, ids, preset=source, init="trained")
    probs = {s.key: s for s in w.steps}["probs"].torch[-1]
    top = [(int(i), label_of(tokenizer, int(i)), float(probs[i])) for i in probs.argsort()[::-1][:5]]
    return RunWalk(w, labels, top, model)


def label_of(tokenizer: Any, token: int) -> str:
    """One id's piece, whitespace visible; the id itself when there is no tokenizer."""
    return visible(tokenizer.decode([token])) if tokenizer is not None else str(token)


WALK_SHOWN_NUMBERS = 65_536
"""The most numbers of one station or weight that run_walk_json sends; a bigger one (a GPT-2
sized embedding table, logits over 50,257 ids) is sent as its shape alone, under "omitted"."""
WALK_TOTAL_NUMBERS = 2_000_000
"""The most numbers one walk sends in all (about 20 MB of JSON): past it, the later stations and
weights go as their shapes alone too."""


def run_walk_json(model: GPT, tokenizer: Any, text: str, source: str) -> dict[str, Any]:
    """The playground's walk of a run's model on `text`, as JSON data: walkthrough_json's fields,
    plus "labels" (one per input position), "targets" and "target_labels" (y, the row shifted by
    one), "next" (the five likeliest tokens after the last position), "row_tokens" (how many
    inputs the whole text makes), "limit" and "cropped". A row longer than the limit is cropped
    to its first `limit` inputs (BOS and the start of the text), as `scratchlm tokenize
    --block-size` cuts a row; the command line refuses such a text instead. `model` is not
    changed: the walk runs on a float64 copy. The page shows torch's side and the largest
    difference from NumPy, so NumPy's own arrays are not sent ("numpy": null)."""
    ids, targets = text_row(tokenizer, text)
    if not ids:
        raise UserError("text: empty; give some text to walk")
    most, whole = walk_limit(model), len(ids)
    ids, targets = ids[:most], targets[:most]
    run = walk_run(model, tokenizer, ids, source)
    shown, omitted = _within(run.walk, WALK_SHOWN_NUMBERS)
    data = walkthrough_json(shown)
    for name in omitted:
        if name in data["weights"]:
            data["weights"][name] = None
    for step in data["steps"]:
        step["numpy"] = None
        if step["key"] in omitted:
            step["torch"] = None
    return {**data, "run": source, "labels": run.labels, "targets": targets,
            "target_labels": [label_of(tokenizer, t) for t in targets], "next": run.top,
            "row_tokens": whole, "limit": most, "cropped": whole > most, "omitted": omitted}


def _within(w: Walkthrough, most: int, total: int = WALK_TOTAL_NUMBERS) -> tuple[Walkthrough, dict[str, list[int]]]:
    """`w` with every array of more than `most` numbers emptied, and those past `total` numbers
    in all (stations first, in order, then weights), and {name or key: its shape}."""
    omitted: dict[str, list[int]] = {}
    sent = 0
    for name, a in [(s.key, s.torch) for s in w.steps] + list(w.weights.items()):
        if a.size > most or sent + a.size > total:
            omitted[name] = list(a.shape)
        else:
            sent += a.size
    empty = np.zeros(0)
    weights = {name: empty if name in omitted else a for name, a in w.weights.items()}
    steps = [replace(s, torch=empty, numpy=empty) if s.key in omitted else s for s in w.steps]
    return replace(w, weights=weights, steps=steps), omitted
