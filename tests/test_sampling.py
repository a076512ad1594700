"""scratchlm.sampling.SamplingOptions: checked once when made, one object for every generation
function (the pipeline's stages themselves are tested in test_generate.py)."""

from __future__ import annotations

import pytest
import torch

from scratchlm.config import GPTConfig
from scratchlm.errors import ConfigError
from scratchlm.generate import generate_ids, iter_tokens
from scratchlm.model import GPT
from scratchlm.sampling import SamplingOptions, choose_next


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("temperature", float("nan")), ("top_k", 0),
                                          ("top_k", 2.5), ("top_p", 0.0), ("top_p", 1.5), ("min_p", -0.1),
                                          ("repetition_penalty", 0.0), ("temperature", True)])
def test_a_meaningless_value_is_refused_naming_the_option(field, value):
    with pytest.raises(ConfigError, match=field):
        SamplingOptions(**{field: value})


def test_options_come_as_an_object_or_as_keywords_never_both():
    options = SamplingOptions(temperature=0.5, top_k=3)
    assert SamplingOptions.of(options) is options
    assert SamplingOptions.of(None, temperature=0.5, top_k=3) == options
    with pytest.raises(TypeError, match="twice"):
        SamplingOptions.of(options, top_k=3)
    with pytest.raises(TypeError):
        SamplingOptions.of(None, topk=3)  # a misspelt keyword is an error, not ignored
    assert SamplingOptions(temperature=0).is_greedy and SamplingOptions(greedy=True).is_greedy
    assert not SamplingOptions().is_greedy


def test_the_object_and_the_keywords_give_the_same_tokens():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=23, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    idx = torch.tensor([[1, 2, 3]])
    options = SamplingOptions(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.2)
    by_object = generate_ids(model, idx, max_new_tokens=12, sampling=options, seed=4)
    by_keywords = generate_ids(model, idx, max_new_tokens=12, temperature=0.7, top_k=5, top_p=0.9,
                               repetition_penalty=1.2, seed=4)
    assert torch.equal(by_object, by_keywords)
    logits = torch.randn(4, 23, generator=torch.Generator().manual_seed(1))
    a = choose_next(logits, None, options, generator=torch.Generator().manual_seed(2))
    b = choose_next(logits, None, generator=torch.Generator().manual_seed(2), temperature=0.7, top_k=5, top_p=0.9,
                    repetition_penalty=1.2)
    assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="top_p"):  # checked before the first step
        next(iter_tokens(model, idx, max_new_tokens=2, top_p=2.0))
