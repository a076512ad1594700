"""Rows for tokens added to a trained model (scratchlm/training/vocab_rows.py): the old ids' logits
are the model's before, and a new id's logit is the mean of the old ids' logits, computed here
from the original model's own logits with NumPy; a new embedding row is the mean of the old rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.training.vocab_rows import grow_vocabulary

OLD = 61  # ids the tokenizer had; the model has 64 rows (padding to a multiple of 8)


def _model(**overrides) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0, **overrides)
    return GPT(cfg).eval()


@pytest.mark.parametrize("overrides", [dict(lm_head_bias=True), dict(tie_weights=True)], ids=["untied-bias", "tied"])
@pytest.mark.parametrize("new_ids", [[61, 62, 63], [61, 62, 63, 64, 65, 66]], ids=["in-padding", "grown"])
def test_old_logits_stay_and_a_new_ids_logit_is_the_mean_of_the_old_ones(overrides, new_ids):
    model = _model(**overrides)
    ids = torch.randint(0, OLD, (2, 12))
    with torch.no_grad():
        before = model(ids)[0].double().numpy()  # (B, T, 64)
    old_wte = model.transformer.wte.weight.detach().double().numpy()[:OLD].copy()
    grown, said = grow_vocabulary(model, OLD, new_ids, pad_multiple=8)
    rows = 64 if new_ids[-1] < 64 else 72
    assert grown.config.vocab_size == rows and grown.transformer.wte.weight.shape == (rows, 16)
    assert said is not None and f"by {len(new_ids)} tokens" in said and f"-> {rows}" in said
    with torch.no_grad():
        after = grown(ids)[0].double().numpy()
    np.testing.assert_allclose(after[..., :OLD], before[..., :OLD], atol=1e-5)
    mean_logit = before[..., :OLD].mean(axis=-1)
    for i in new_ids:
        np.testing.assert_allclose(after[..., i], mean_logit, atol=1e-5)
        np.testing.assert_allclose(grown.transformer.wte.weight[i].detach().double().numpy(), old_wte.mean(axis=0), atol=1e-7)
    if overrides.get("tie_weights"):
        assert grown.lm_head.weight is grown.transformer.wte.weight
    # the grown model trains: a step on a new id's target reaches its rows
    loss = grown(ids, torch.full_like(ids, new_ids[-1]))[1]
    loss.backward()
    assert grown.lm_head.weight.grad[new_ids[-1]].abs().sum() > 0


def test_nothing_new_leaves_the_model_and_an_old_id_is_refused():
    model = _model()
    assert grow_vocabulary(model, OLD, [], pad_multiple=8) == (model, None)
    with pytest.raises(ValueError, match="inside the 61 ids"):
        grow_vocabulary(model, OLD, [60, 61], pad_multiple=8)
