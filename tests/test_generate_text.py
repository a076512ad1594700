"""Generation, text in and text out: the greedy continuation as text and ids, end-of-text and stop
strings, the empty and the cropped prompt, several samples, streaming (whole characters only, the
pieces joining to generate's text), each streamed token's scores, and special tokens left out of
the text (scratchlm.generation.generate, scratchlm.generation.text_rows)."""

from __future__ import annotations

import pytest
import torch

from scratchlm.errors import UserError
from scratchlm.generation.generate import IncrementalText, generate, stream
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

from conftest import shared_file
from helpers import ByteTokenizer, LettersTokenizer, letters_model, plain_loop, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py


def test_generate_returns_the_greedy_continuation_as_text_and_ids():
    tok = LettersTokenizer(eos_id=10**6)  # an eos the model can never emit: runs to the end
    model = letters_model()
    expected = plain_loop(model, torch.tensor([tok.encode("abc")]), 40)[0][0, 3:].tolist()
    out = generate(model, tok, "abc", max_new_tokens=40, greedy=True)
    assert out.ids == expected and out.text == tok.decode(expected)
    assert out.finish_reasons == ["length"] and out.prompt_ids == [0, 1, 2] and not out.prompt_cropped


def test_generate_stops_at_end_of_text_and_at_stop_strings():
    model = letters_model()
    full = plain_loop(model, torch.tensor([[0, 1, 2]]), 60)[0][0, 3:].tolist()
    # declare a token the model emits mid-way as end-of-text: output must end just before it
    eos = full[len(full) // 2]
    cut = full.index(eos)
    out = generate(model, LettersTokenizer(eos_id=eos), "abc", max_new_tokens=60, greedy=True)
    assert out.ids == full[:cut] and out.finish_reasons == ["eos"]

    tok = LettersTokenizer(eos_id=10**6)
    text = tok.decode(full)
    stop = text[20:23]
    out = generate(model, tok, "abc", max_new_tokens=60, greedy=True, stop=["zzz", stop])
    assert out.text == text[: text.find(stop)] and out.finish_reasons == ["stop"]
    assert tok.decode(out.ids).endswith(stop)  # ids run up to the token that completed it
    assert "".join(stream(model, tok, "abc", max_new_tokens=60, greedy=True, stop=[stop])) == out.text


def test_empty_prompt_starts_from_bos_and_long_prompt_is_cropped_with_a_warning():
    tok = LettersTokenizer(eos_id=10**6)
    model = letters_model()
    from_bos = plain_loop(model, torch.tensor([[tok.bos_id]]), 10)[0][0, 1:].tolist()
    assert generate(model, tok, "", max_new_tokens=10, greedy=True).ids == from_bos

    long_prompt = "abcdefghij" * 3  # 30 tokens, block_size 16
    tail = plain_loop(model, torch.tensor([tok.encode(long_prompt)[-16:]]), 10)[0][0, 16:].tolist()
    with pytest.warns(UserWarning, match="only its last 16 tokens"):
        out = generate(model, tok, long_prompt, max_new_tokens=10, greedy=True)
    assert out.prompt_cropped and out.ids == tail


def test_num_samples_are_independent_draws_reproducible_by_seed():
    tok = LettersTokenizer(eos_id=10**6)
    model = letters_model()
    out = generate(model, tok, "ab", max_new_tokens=30, num_samples=3, seed=5, temperature=1.5)
    assert len(out.texts) == 3 and len(set(out.texts)) == 3
    assert generate(model, tok, "ab", max_new_tokens=30, num_samples=3, seed=5, temperature=1.5).texts == out.texts
    beams = generate(model, tok, "ab", max_new_tokens=8, beams=4, num_samples=2)
    assert len(beams.texts) == 2 and beams.logprobs[0] >= beams.logprobs[1]


def test_stream_pieces_join_to_the_generated_text():
    tok = ByteTokenizer()
    model = tiny_model(seed=13, vocab_size=258)
    for seed in range(3):
        pieces = list(stream(model, tok, "hé", max_new_tokens=40, seed=seed))
        assert "".join(pieces) == generate(model, tok, "hé", max_new_tokens=40, seed=seed).text


def test_stream_tokens_gives_every_token_its_scores_and_the_texts_join_to_generate():
    """Each TokenStep's id is generate's next id (an end-of-text id included, with no text), its
    logits are the plain forward pass's at that position, and the texts, the final flush
    included, join to generate's text; with a stop string the last step says why it ended."""
    from scratchlm.generation.generate import stream_tokens

    tok = ByteTokenizer()
    model = tiny_model(seed=13, vocab_size=258)
    for seed in range(3):
        steps = list(stream_tokens(model, tok, "hé", max_new_tokens=30, seed=seed, temperature=1.5))
        result = generate(model, tok, "hé", max_new_tokens=30, seed=seed, temperature=1.5)
        assert steps[-1].id is None and steps[-1].logits is None and all(s.id is not None for s in steps[:-1])
        chosen = [s.id for s in steps[:-1]]
        assert chosen[: len(result.ids)] == result.ids
        assert "".join(s.text for s in steps) == result.text
        ids = tok.encode("hé")
        for s in steps[:-1]:
            with torch.no_grad():
                plain = model(torch.tensor([ids[-model.config.block_size:]]))[0][0, -1, :258]
            torch.testing.assert_close(s.logits.float(), plain, rtol=1e-4, atol=1e-4)
            ids.append(s.id)
    stops = list(stream_tokens(model, tok, "hé", max_new_tokens=60, seed=0, stop=["e"]))
    text = "".join(s.text for s in stops)
    assert "e" not in text and stops[-1].reason in ("stop", "length")
    ended = [s.reason for s in stops[:-1] if s.reason is not None]
    assert ended in ([], ["stop"]) and (ended == ["stop"]) == (stops[-1].reason == "stop")


def test_stream_tokens_says_the_prompt_before_the_first_step_and_warns_of_a_crop_once():
    """prompt_ids is the prompt as the tokenizer encodes it and cropped says whether it outgrew
    the context; both known before any step, the crop warned of once (the playground's start
    event reads them rather than encoding the prompt a second time)."""
    import warnings

    from scratchlm.generation.generate import stream_tokens

    tok = ByteTokenizer()
    model = tiny_model(seed=13, vocab_size=258)
    steps = stream_tokens(model, tok, "hé", max_new_tokens=3, seed=0)
    assert steps.prompt_ids == tok.encode("hé") and steps.cropped is False
    steps.close()
    long = "ab" * model.config.block_size
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = stream_tokens(model, tok, long, max_new_tokens=3, seed=0)
        texts = "".join(s.text for s in steps)
    assert steps.prompt_ids == tok.encode(long) and steps.cropped is True
    assert len([w for w in caught if "context" in str(w.message)]) == 1
    assert texts == generate(model, tok, long[-model.config.block_size:], max_new_tokens=3, seed=0).text


def test_incremental_text_never_prints_half_a_character():
    tok = ByteTokenizer()
    text = "héllo wörld 你好 🎉 done"
    ids = tok.encode(text)
    printer = IncrementalText()
    pieces = [printer.piece(tok.decode(ids[:n])) for n in range(1, len(ids) + 1)]
    pieces.append(printer.piece(tok.decode(ids), final=True))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # a tail that could begin a stop string waits until it is clear
    printer = IncrementalText(stops=["wörld!"])
    early = printer.piece("héllo wö")
    assert early == "héllo " and printer.piece("héllo wörm") == "wörm"


@torch.enable_grad()
def test_stream_prints_multibyte_text_whole_from_a_model_that_learned_it():
    """End to end: a tiny model memorises one UTF-8 string byte by byte; streaming its greedy
    output must show every character whole, then stop at end-of-text."""
    tok = ByteTokenizer()
    target = "añ你🎉ok"
    seq = torch.tensor([[tok.bos_id] + tok.encode(target) + [tok.eos_id]])  # (1, 14)
    model = tiny_model(seed=14, vocab_size=258, block_size=16, n_embd=32)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        _, loss = model(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = generate(model, tok, "", max_new_tokens=30, greedy=True)
    assert out.text == target and out.finish_reasons == ["eos"]  # the model did learn it
    pieces = list(stream(model, tok, "", max_new_tokens=30, greedy=True))
    assert "".join(pieces) == target
    assert all("\ufffd" not in p for p in pieces)
    assert len(pieces) >= 4  # printed as it went, not all at the end


@pytest.mark.parametrize("kind", ["bpe", "gpt2"])
def test_real_tokenizers_stream_whole_characters(kind):
    tokenizer_module = pytest.importorskip("scratchlm.text.tokenizer")
    if kind == "bpe":  # trained on ASCII only, so every non-ASCII character is split into bytes
        tok = tokenizer_module.train_tokenizer("bpe", ["the quick brown fox jumps over the lazy dog"] * 20, 300)
    else:
        rank_file = shared_file("gpt2/gpt2.tiktoken")
        tok = tokenizer_module.get_tokenizer("gpt2", tokenizer_file=rank_file)
    text = "naïve café — 東京 🎉"
    ids = tok.encode(text)
    # some character really is split across tokens, so a naive printer would show U+FFFD
    assert any("\ufffd" in tok.decode(ids[:n]) for n in range(1, len(ids)))
    printer = IncrementalText()
    pieces = [printer.piece(tok.decode(ids[:n])) for n in range(1, len(ids) + 1)]
    pieces.append(printer.piece(tok.decode(ids), final=True))
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)


def test_unknown_characters_for_a_char_tokenizer_are_a_clear_error():
    tokenizer_module = pytest.importorskip("scratchlm.text.tokenizer")
    tok = tokenizer_module.CharTokenizer("abc ")
    model = tiny_model(vocab_size=tok.vocab_size)
    with pytest.raises(UserError, match="'x'"):
        generate(model, tok, "abx", max_new_tokens=3)



def test_a_model_wider_than_its_tokenizer_only_chooses_ids_the_tokenizer_has():
    """A padded vocabulary (here 13 ids with text plus 11 without, favoured by the head's bias):
    every generation path chooses among the tokenizer's ids, with the tokens the model's own
    scores cut to those ids give, and never fails on an id it cannot decode."""

    class Strict(LettersTokenizer):
        def decode(self, ids) -> str:
            return "".join(self.alphabet[i] if i < len(self.alphabet) else "" if i < self.vocab_size else 1 / 0
                           for i in ids)

    tok = Strict(eos_id=-1)  # no end token: every sample runs its full length
    model = tiny_model(seed=21, vocab_size=24)
    with torch.no_grad():
        model.lm_head.bias[tok.vocab_size :] = 5.0  # the ids past the tokenizer would win every step
    prompt = tok.encode("abc")
    block = model.config.block_size
    with torch.no_grad():  # by hand: the plain loop over the cut scores
        ids = list(prompt)
        for _ in range(10):
            logits, _ = model(torch.tensor([ids[-block:]]))
            ids.append(int(logits[0, -1, : tok.vocab_size].argmax()))
    want = ids[len(prompt) :]
    for use_cache in (True, False):
        assert generate(model, tok, "abc", max_new_tokens=10, greedy=True, use_cache=use_cache).ids == want
    sampled = generate(model, tok, "abc", max_new_tokens=30, temperature=2.0, num_samples=4, seed=0)
    assert all(max(row) < tok.vocab_size for row in sampled.all_ids)
    beams = generate(model, tok, "abc", max_new_tokens=6, beams=3, num_samples=3)
    assert all(max(row) < tok.vocab_size for row in beams.all_ids)
    assert "".join(stream(model, tok, "abc", max_new_tokens=10, greedy=True)) == tok.decode(want)



def test_a_stop_string_at_the_very_start_stops_at_once():
    tok = LettersTokenizer()
    model = letters_model(seed=12)
    first = generate(model, tok, "abc", max_new_tokens=1, greedy=True).text
    out = generate(model, tok, "abc", max_new_tokens=10, greedy=True, stop=[first])
    assert out.text == "" and out.finish_reasons == ["stop"]


def test_a_prompt_exactly_as_long_as_the_context_is_not_cropped():
    import warnings

    tok = LettersTokenizer()
    model = letters_model(seed=12)
    prompt = "abcdefghij abcde"[: model.config.block_size]
    assert len(tok.encode(prompt)) == model.config.block_size
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no crop warning
        out = generate(model, tok, prompt, max_new_tokens=2, greedy=True)
    assert not out.prompt_cropped
    with pytest.warns(UserWarning, match="last 16 tokens"):
        assert generate(model, tok, prompt + "a", max_new_tokens=2, greedy=True).prompt_cropped



def test_the_crop_warning_points_at_the_callers_line():
    model, tok = tiny_model(seed=2, vocab_size=258), ByteTokenizer()
    with pytest.warns(UserWarning, match="only its last 16 tokens are used") as caught:
        generate(model, tok, "x" * 40, max_new_tokens=1)
    assert caught[0].filename == __file__  # stacklevel: the warning names this file, not generate.py



# ---------------------------------------------------------------- special tokens in generated text


def test_bpe_text_rows_leave_special_tokens_out_as_transformers_decode_does(tmp_path):
    from transformers import AutoTokenizer

    from scratchlm.hf.interop import export_hf
    from scratchlm.generation.text_rows import TextRow
    from scratchlm.text.tokenizer import train_tokenizer

    tok = train_tokenizer("bpe", ["héllo wörld, 猫 and more words " * 20], vocab_size=300)
    export_hf(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16)),
              tmp_path / "hf", tok)
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    cat = tok.encode("猫")
    ids = [tok.bos_id, *tok.encode("héllo"), tok.bos_id, *cat[:1], tok.bos_id, *cat[1:], *tok.encode(" wörld")]
    row = TextRow(tok, tok.eos_id, [])
    for i in ids:
        row.push(i)
    assert row.text == hf_tok.decode(ids, skip_special_tokens=True) == "héllo猫 wörld"
