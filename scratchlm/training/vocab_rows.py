"""New tokens in a trained model: its token embedding (and an untied head) gain rows for ids that a
grown tokenizer added (the chat template's turns, characters the fine-tuning data brings), and
every row the model had keeps its numbers.

    before   wte (V, C), lm_head (V, C) [+ bias (V,)]; the tokenizer had n ids
    after    wte (V', C), lm_head (V', C): V' = V while the new ids fit in its padding rows,
             else the tokenizer's size rounded up to the run's pad multiple
    a new id's rows start at the mean of the rows of the n ids it had: its embedding is an average
             token's, and its logit is the mean logit of the old ones (h . mean(W) = mean(h . W)),
             so a new token is neither ignored nor favoured before it is trained (Hugging Face's
             resize_token_embeddings starts new rows near that mean for the same reason)

Logits of the old ids are unchanged: a row of lm_head is read by its own id only. Their
probabilities shift a little, since the softmax now also counts the new ids.
"""

from __future__ import annotations

from typing import Sequence

import torch

from scratchlm.model.gpt import GPT

_ROWS = ("transformer.wte.weight", "lm_head.weight", "lm_head.bias")


@torch.no_grad()
def grow_vocabulary(model: GPT, old_ids: int, new_ids: Sequence[int], pad_multiple: int) -> tuple[GPT, str | None]:
    """`model` with rows for `new_ids` (ids from `old_ids` on, which a grown tokenizer added),
    and a line saying what changed (None when nothing did). In place: when the vocabulary must
    grow, only the (V, C) matrices are made anew (the blocks are never copied)."""
    new_ids = sorted(set(new_ids))
    if not new_ids:
        return model, None
    if new_ids[0] < old_ids:
        raise ValueError(f"new ids start at {new_ids[0]}, inside the {old_ids} ids the model was trained on")
    cfg = model.config
    rows = rows_for(cfg.vocab_size, new_ids[-1] + 1, pad_multiple)
    if rows > cfg.vocab_size:
        _grow_rows(model, rows)
    params = dict(model.named_parameters())  # a tied head is wte itself, listed once
    for name in _ROWS:
        if name in params:
            params[name][new_ids] = params[name][:old_ids].mean(dim=0)
    said = (f"the model's vocabulary grows by {len(new_ids)} tokens (rows {cfg.vocab_size} -> {rows}); "
            "each new row starts at the mean of the old ones")
    return model, said


def _grow_rows(model: GPT, rows: int) -> None:
    """The embedding and head of `model` made `rows` long, in place: old rows kept, new ones zero
    (set by the caller), a tied head tied again, the config saying the new size."""
    old_wte, old_head = model.transformer.wte, model.lm_head
    weight = old_wte.weight
    wte = torch.nn.Embedding(rows, weight.shape[1], device=weight.device, dtype=weight.dtype)
    wte.weight.zero_()
    wte.weight[: len(weight)] = weight
    head = torch.nn.Linear(weight.shape[1], rows, bias=old_head.bias is not None, device=weight.device, dtype=weight.dtype)
    if model.config.tie_weights:
        head.weight = wte.weight
    else:
        head.weight.zero_()
        head.weight[: len(weight)] = old_head.weight
    if old_head.bias is not None:
        head.bias.zero_()
        head.bias[: len(weight)] = old_head.bias
    model.transformer.wte, model.lm_head = wte.train(old_wte.training), head.train(old_head.training)
    model.config = model.config.replace(vocab_size=rows)


def rows_for(rows: int, ids: int, pad_multiple: int) -> int:
    """The rows a model of `rows` needs for `ids` ids: its own while they fit, else `ids`
    rounded up to the pad multiple."""
    from scratchlm.data.shards import padded_vocab_size

    return rows if ids <= rows else padded_vocab_size(ids, pad_multiple)
