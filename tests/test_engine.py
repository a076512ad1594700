"""The settings record (scratchlm.generation.settings.GenerationSettings: checked once when made,
one object or its fields as keywords) and the Engine (scratchlm.generation.engine: one model,
tokenizer, dtype and cache choice, reused across generations with different settings), and the
decoding copy's attention built by its own constructor (scratchlm.kernels.decoding_copy)."""

from __future__ import annotations

import pytest
import torch

from scratchlm.errors import ConfigError
from scratchlm.generation.engine import Engine
from scratchlm.generation.sampling import SamplingOptions
from scratchlm.generation.settings import GenerationSettings

from helpers import TINY, LettersTokenizer, letters_model, lively_model, plain_loop

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py


@pytest.mark.parametrize("field, value", [("max_new_tokens", -1), ("max_new_tokens", 2.0), ("seed", -1),
                                          ("seed", True), ("num_samples", 0), ("beams", 0), ("beams", True),
                                          ("num_samples", 2.5), ("length_penalty", float("nan")),
                                          ("temperature", -1.0), ("top_p", 0.0)])
def test_a_meaningless_setting_is_refused_naming_it(field, value):
    with pytest.raises(ConfigError, match=field):
        GenerationSettings.of(**{field: value})


def test_settings_come_as_an_object_or_as_keywords_never_both():
    settings = GenerationSettings(max_new_tokens=7, sampling=SamplingOptions(temperature=0.5, top_k=3), seed=2)
    assert GenerationSettings.of(settings) is settings
    assert GenerationSettings.of(max_new_tokens=7, temperature=0.5, top_k=3, seed=2) == settings
    assert GenerationSettings.of(max_new_tokens=7, sampling=SamplingOptions(temperature=0.5, top_k=3), seed=2) == settings
    with pytest.raises(TypeError, match="twice"):
        GenerationSettings.of(settings, seed=3)
    with pytest.raises(TypeError):
        GenerationSettings.of(max_new_token=7)  # a misspelt keyword is an error, not ignored
    with pytest.raises(TypeError, match="twice"):
        GenerationSettings.of(sampling=SamplingOptions(), temperature=0.5)
    with pytest.raises(TypeError):
        GenerationSettings(sampling={"temperature": 0.5})
    with pytest.raises(AttributeError):
        settings.seed = 3  # frozen: one generation's settings do not change under it


def test_stop_strings_are_kept_as_a_tuple_without_empty_ones_and_beams_bound_the_samples():
    assert GenerationSettings(stop=["", "ab", "c"]).stop == ("ab", "c")
    assert GenerationSettings(stop=None).stop == ()
    with pytest.raises(TypeError, match="one string"):
        GenerationSettings(stop="ab")  # would otherwise stop at "a" and at "b"
    assert GenerationSettings(beams=3, num_samples=3).num_samples == 3
    with pytest.raises(ConfigError, match="num_samples"):
        GenerationSettings(beams=3, num_samples=4)


def test_one_engine_serves_many_generations_with_their_own_settings():
    """The same Engine, greedy then sampled then greedy again without the cache: each result is
    what the plain loop (written out in helpers) or a fresh engine gives."""
    tok = LettersTokenizer(eos_id=10**6)  # an end token the model never emits
    model = letters_model()
    engine = Engine(model, tok)
    want = plain_loop(model, torch.tensor([tok.encode("abc")]), 12)[0][0, 3:].tolist()
    assert engine.generate("abc", max_new_tokens=12, greedy=True).ids == want
    sampled = GenerationSettings.of(max_new_tokens=12, temperature=1.5, seed=4, num_samples=2)
    first = engine.generate("abc", sampled)
    assert Engine(model, tok).generate("abc", sampled) == first
    assert Engine(model, tok, use_cache=False).generate("abc", max_new_tokens=12, greedy=True).ids == want
    assert "".join(engine.stream("abc", max_new_tokens=12, greedy=True)) == tok.decode(want)


def test_engine_ids_follow_the_plain_loop_and_its_end_token():
    model = lively_model("rope")
    idx = torch.randint(0, TINY["vocab_size"], (2, 4), generator=torch.Generator().manual_seed(3))
    want = plain_loop(model, idx, 30)[0]
    for use_cache in (True, False):
        assert torch.equal(Engine(model, use_cache=use_cache).generate_ids(idx, max_new_tokens=30, greedy=True), want)
    eos = int(want[0, 6])  # a token row 0 produces at its third step
    got = Engine(model, eos_id=eos).generate_ids(idx, max_new_tokens=30, greedy=True)
    assert got[0, 6:].eq(eos).all() and torch.equal(got[0, :6], want[0, :6])


def test_a_stream_is_one_continuation():
    engine = Engine(letters_model(), LettersTokenizer())
    for options, name in ((dict(num_samples=2), "num_samples"), (dict(beams=2), "beams")):
        with pytest.raises(ConfigError, match=name):
            engine.stream_tokens("abc", max_new_tokens=3, **options)


def test_the_decoding_attention_takes_over_every_attribute_of_the_models():
    """DecodingAttention is made by its own constructor (not __new__ and a __dict__ copy): it must
    still hold every submodule and setting the model's attention has, the very same objects, so
    that an attribute added to CausalSelfAttention later cannot be left behind unnoticed."""
    from scratchlm.kernels.decoding_copy import DecodingAttention
    from scratchlm.model.gpt import CausalSelfAttention

    attn = letters_model().transformer.h[0].attn
    attn.impl = "explicit"  # a setting away from its default, so a default would not pass for a copy
    fast = DecodingAttention(attn, kernel=object())
    assert isinstance(fast, CausalSelfAttention)
    own = {k: v for k, v in vars(attn).items() if not k.startswith("_")}
    assert {k: v for k, v in vars(fast).items() if not k.startswith("_") and k != "kernel"} == own
    assert dict(fast.named_children()) == dict(attn.named_children())
    assert all(a is b for a, b in zip(fast.parameters(), attn.parameters()))
    assert set(vars(fast)) - set(vars(attn)) == {"kernel"}
