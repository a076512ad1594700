"""`scratchlm export-gguf` checked against llama.cpp itself (llama-cpp-python, built from source by
.ci/run): trained runs of each layout llama.cpp knows continue a prompt greedily exactly as
`scratchlm generate --greedy` does, token for token inside the context, from f32 and f16 files;
q8_0 files (as exported, and with --all-q8_0) predict the same next token on at least 95% of
held-out prompts of 8 to 64 tokens; f32 logits equal the model's own; no q8_0 matrix is one that
llama.cpp's AMX kernels would take; and llama.cpp's tokenizer, read from the file, encodes and
decodes as scratchlm's does.

llama.cpp runs in a child process (tests/llama_cpp_child.py): a crash inside it fails one test,
naming the signal, and the rest of the run goes on.
"""

from __future__ import annotations

import importlib.util
import os
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from scratchlm.gguf.export import export_gguf
from scratchlm.checkpoint import load_model

import helpers
from helpers import llama_cpp_answers as llama, llama_cpp_scores as llama_scores

if importlib.util.find_spec("llama_cpp") is None:  # found, not imported: llama.cpp runs in the child only
    pytest.skip("llama-cpp-python is not installed (.ci/run builds it from source)", allow_module_level=True)


GPT2_RANKS = Path(__file__).resolve().parents[2] / "shared" / "data" / "gpt2" / "gpt2.tiktoken"
QUIET = ["--eval_interval", "0", "--sample_tokens", "0", "--progress", "quiet", "--threads", "1"]
# name: the training flags (the README's default run first), and the layout llama.cpp must read
RUNS = {
    "default": (["--preset", "shakespeare-char", "--max_steps", "300"], "gptneox"),
    "llama": (["--preset", "shakespeare-char-fast", "--max_steps", "150", "--norm", "rmsnorm", "--activation", "swiglu",
               "--no-mlp_bias", "--no-proj_bias", "--no-lm_head_bias"], "llama"),
    "gpt2-bpe": (["--preset", "smoke", "--tokenizer", "bpe", "--vocab_size", "400", "--block_size", "64",
                  "--activation", "gelu_tanh", "--max_steps", "150", "--batch_size", "8", "--lr", "3e-3"], "gpt2"),
    # GPT-2's 50,257 tokens make each step slow and Shakespeare hard to learn in a few: two lines
    # of verse, repeated, give a continuation that says something in 60 steps
    "gpt2-tokenizer": (["--preset", "smoke", "--tokenizer", "gpt2", "--tokenizer_file", str(GPT2_RANKS), "--data",
                        "{verse}", "--block_size", "64", "--activation", "gelu_tanh", "--tie_weights", "--max_steps",
                        "60", "--batch_size", "4", "--lr", "3e-3"], "gpt2"),
}
VERSE = "Where is the king? He speaks to a queen of night and day.\nROMEO: my lord, thou art the sun, and Juliet the moon.\n"
VERSE_HELD_OUT = "ROMEO: the queen speaks to the moon, and the king of day is the sun.\nWhere is my lord? He speaks to Juliet."
TIE = {"f32": 5e-3, "f16": 1e-2}  # see the greedy test
PROMPTS = {"char": ["ROMEO:\n", "KING HENRY: What say"], "bpe": ["ROMEO:\n", "Where is the king"]}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return {**os.environ, "SCRATCHLM_CACHE": str(tmp_path_factory.mktemp("cache")), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, env):
    """name -> run folder, each trained once per module, on first use."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name == "gpt2-tokenizer" and not GPT2_RANKS.is_file():
            pytest.skip(f"shared data missing: {GPT2_RANKS} (GPT-2's rank file, for a run with its tokenizer)")
        if name not in made:
            out = tmp_path_factory.mktemp(name) / "run"
            verse = out.parent / "verse.txt"
            verse.write_text(VERSE * 600, encoding="utf-8")
            cli(env, "train", *(flag.format(verse=verse) for flag in RUNS[name][0]), *QUIET, "--out_dir", out)
            made[name] = out
        return made[name]

    return get


def cli(env, *args) -> str:
    result = subprocess.run([sys.executable, "-m", "scratchlm", *map(str, args)], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def held_out(name: str, tok, length: int) -> list[int]:
    """`length` ids of text the run did not train on: the built-in corpus's last characters (its
    validation tail), or the verse's words in new lines."""
    from scratchlm.text.corpus import shakespeare_documents

    if name == "gpt2-tokenizer":
        return tok.encode(VERSE_HELD_OUT * 4)[:length]
    *_, (_, last) = shakespeare_documents()
    return tok.encode(last[-4 * length:])[-length:]


def near_ties(model, ids: list[int], new: list[int], vocab: int) -> list[float]:
    """For each new token, the model's own gap between its best and second-best logit there."""
    with torch.no_grad():
        out = model(torch.tensor([ids + new]))
        logits = (out[0] if isinstance(out, tuple) else out)[0, len(ids) - 1 : -1, :vocab].double()
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_greedy_text_of_each_layout_equals_scratchlm_generate_in_f32_and_f16(name, trained, env, tmp_path):
    """Token for token, up to a near tie: llama.cpp keeps its K/V cache in f16 and reads GELU from
    an f16 table (and the default run's exact GELU becomes the tanh form), which moved logits by
    up to 2.3e-3 from an f32 file and 4.6e-3 from an f16 one on these runs; where the model's two
    best tokens are closer than TIE[dtype] (about twice that), llama.cpp may take the second, and
    the texts part there. Every prompt must run at least half its room before such a tie."""
    from scratchlm.generation.generate import generate

    run = trained(name)
    model, tok, _ = load_model(run)
    context = model.config.block_size
    wanted = []  # (prompt ids, scratchlm's new ids, the text `scratchlm generate --greedy` prints, gaps)
    for prompt in PROMPTS["char" if tok.kind == "char" else "bpe"]:
        ids = tok.encode(prompt)
        ours = generate(model, tok, prompt, greedy=True, max_new_tokens=context - len(ids))
        text = cli(env, "generate", "--checkpoint", run, "--prompt", prompt, "--greedy", "--max-new-tokens",
                   context - len(ids))
        assert text == prompt + ours.text + "\n"
        assert len(set(ours.ids)) >= 4, f"{name}: a degenerate continuation tests little: {text!r}"
        wanted.append((ids, ours.ids, text[:-1], near_ties(model, ids, ours.ids, tok.vocab_size)))
    for dtype in ("f32", "f16"):
        out = tmp_path / f"{dtype}.gguf"
        said = cli(env, "export-gguf", run, out, "--dtype", dtype)
        assert f"llama.cpp {RUNS[name][1]}, {dtype}" in said
        greedy = llama(out, context, [{"op": "greedy", "ids": ids, "n": context - len(ids)} for ids, *_ in wanted],
                       tmp_path)
        for (ids, ours, text, gaps), answer in zip(wanted, greedy):
            theirs = answer["ids"]
            if tok.eos_id in theirs:  # scratchlm stops at <|endoftext|>; llama.cpp's generate goes on
                theirs = theirs[: theirs.index(tok.eos_id)]
            tie = next((i for i, gap in enumerate(gaps) if gap < TIE[dtype]), len(ours))
            assert tie >= len(ours) // 2, f"{name} {dtype} {text!r}: a near tie at new token {tie}"
            assert theirs[:tie] == ours[:tie], f"{name} {dtype} {text!r}: first difference at new token " \
                f"{next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b)} (near tie: {tie})"
            if tie == len(ours):
                assert theirs == ours
                assert tok.decode(ids) + answer["text"] == text


PROMPT_LENGTHS = (8, 16, 32, 64)  # each from an empty cache: llama.cpp multiplies a whole prompt at once
FORMS = {"f32": ("f32", False), "bf16": ("bf16", False), "q8_0": ("q8_0", False), "q8_0-all": ("q8_0", True)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_f32_logits_equal_the_models_and_q8_0_predicts_the_same_next_token(name, trained, tmp_path):
    """Held-out prompts of 8 to 64 tokens through llama.cpp (every position's logits, float32 K/V
    cache) beside the model's own forward pass: f32 within the rounding of llama.cpp's GELU
    table, 5e-3 (the Llama layout has no GELU: 2e-4); bf16 and q8_0, as exported and with every
    matrix quantized (--all-q8_0), choosing the same next token at >= 95% of positions."""
    model, tok, _ = load_model(trained(name))
    context = model.config.block_size
    ids = held_out(name, tok, context)
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
        want = (logits[0] if isinstance(logits, tuple) else logits)[0, :, : tok.vocab_size].double().numpy()
    assert (want.max(1) - np.median(want, 1)).mean() > 3  # trained: peaked, far from a fresh model's flat logits
    prompts = [ids[:n] for n in PROMPT_LENGTHS if n <= context]
    assert len(prompts[-1]) == context  # a causal model's logits on a prefix are the first rows of the whole
    for form, (dtype, all_q8_0) in FORMS.items():
        export_gguf(model, tok, tmp_path / f"{form}.gguf", dtype, all_q8_0=all_q8_0)
        got = llama_scores(tmp_path / f"{form}.gguf", context, prompts, tmp_path)
        if form == "f32":
            for rows in got:
                assert np.abs(rows - want[: len(rows)]).max() <= (2e-4 if RUNS[name][1] == "llama" else 5e-3)
            continue
        same = np.concatenate([rows.argmax(1) == want[: len(rows)].argmax(1) for rows in got])
        assert same.mean() >= 0.95, f"{form} agrees on {same.mean():.1%} of next tokens"


def amx_would_take(reader, name: str, shape: tuple[int, ...]) -> bool:
    """By llama.cpp's source (llama-cpp-python 0.3.36): a weight goes to the AMX buffer, and is
    multiplied by AMX tiles, when it is the left side of a matrix product (not the token or
    position table, which are looked up by row, unless the token table is also the head because
    there is no output.weight), with output width (GGUF's second dimension) a multiple of
    2 * TILE_N = 32 and input width (the first) a multiple of TILE_K = 32 (ggml-cpu/amx/amx.cpp,
    supports_op)."""
    names = {t.name for t in reader.tensors}
    product = name not in ("token_embd.weight", "position_embd.weight") or (
        name == "token_embd.weight" and "output.weight" not in names)
    return product and len(shape) == 2 and shape[0] % 32 == 0 and shape[1] % 32 == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_no_q8_0_matrix_is_one_llama_cpps_amx_kernels_would_take(name, trained, tmp_path):
    """The AMX path (Intel CPUs with AMX-INT8, llama.cpp built for them) crashed on q8_0 products
    of prompts of 8 tokens or more; no machine here has AMX, so its conditions are checked on the
    file: as exported, every matrix they hold is f16 and the rest q8_0; with --all-q8_0, every
    matrix whose rows split into 32-blocks is q8_0."""
    import gguf

    model, tok, _ = load_model(trained(name))
    for all_q8_0 in (False, True):
        out = export_gguf(model, tok, tmp_path / "q8.gguf", "q8_0", all_q8_0=all_q8_0)
        reader = gguf.GGUFReader(out.path)
        matrices = {t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name) for t in reader.tensors
                    if len(t.shape) == 2 and t.name != "position_embd.weight"}
        taken = {k for k, (shape, _) in matrices.items() if amx_would_take(reader, k, shape)}
        for key, (shape, kind) in matrices.items():
            wanted = "F16" if shape[0] % 32 or (key in taken and not all_q8_0) else "Q8_0"
            assert kind == wanted, f"{key} {shape}: {kind}"
        assert taken, "these runs have matrices the AMX path would take: the test must see some"
        assert any(kind == "Q8_0" for _, kind in matrices.values())  # the token table at least stays 8-bit


def test_a_crash_inside_llama_cpp_fails_one_test_naming_the_signal(tmp_path, monkeypatch):
    """What a segmentation fault in llama.cpp looks like from here: a child that dies of SIGSEGV."""
    crasher = tmp_path / "crash.py"
    crasher.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", encoding="utf-8")
    monkeypatch.setattr(helpers, "LLAMA_CPP_CHILD", crasher)
    with pytest.raises(pytest.fail.Exception, match="llama.cpp died of SIGSEGV on m.gguf"):
        llama(tmp_path / "m.gguf", 64, [], tmp_path)


# --------------------------------------------------------------------------------------------
# The tokenizer inside the file: llama.cpp's encoding and decoding beside scratchlm's
# --------------------------------------------------------------------------------------------


ALPHABET = string.printable + "床前明月光，疑是地上霜。举头望低思故乡"
TEXTS = {
    "ascii": "Where is the king?  He speaks:\n'tis night... and\tday, 42 -- don't!\n\n  ",
    "chinese": "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。",
    "special": "a <|endoftext|> b <|bos|>",
}
UNSEEN = {"apart": "café, Zürich; 李 x 白", "runs": "naïve ßüé 😀😀 end"}  # characters no char vocabulary here holds


def tiny_gguf(tokenizer, path: Path) -> Path:
    """A small random model around `tokenizer`, as GGUF (tokenization needs no training)."""
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=32,
                       pos_embedding="rope", activation="gelu_tanh", lm_head_bias=False)
    export_gguf(GPT(config).eval(), tokenizer, path)
    return path


def char_ids_llama_cpp_expects(tok, text: str) -> list[int]:
    """By hand: each known character its id; each run of unseen ones a single unknown id (the
    tokenizer's <unk>, else <|endoftext|>), as llama.cpp's unigram tokenizer merges them."""
    unk = tok.unk_id if tok.unk_id is not None else tok.eos_id
    ids = tok.piece_ids()
    out: list[int] = []
    for i, ch in enumerate(text):
        if ch in ids:
            out.append(ids[ch])
        elif i == 0 or text[i - 1] in ids:  # the first of a run
            out.append(unk)
    return out


def tokenizers_under_test(name: str):
    from scratchlm.text.tokenizer import BPETokenizer, CharTokenizer, GPT2Tokenizer

    corpus = [ALPHABET, *TEXTS.values()] * 20
    if name == "char":
        return CharTokenizer.train(corpus)
    if name == "char-unk":
        return CharTokenizer.train(corpus, unk=True)
    if name == "bpe":
        return BPETokenizer.train(corpus + list(UNSEEN.values()), vocab_size=400)
    if not GPT2_RANKS.is_file():
        pytest.skip(f"shared data missing: {GPT2_RANKS} (GPT-2's rank file)")
    return GPT2Tokenizer.from_rank_file(GPT2_RANKS)


@pytest.mark.parametrize("name", ["char", "char-unk", "bpe", "gpt2"])
def test_llama_cpp_tokenizes_and_detokenizes_as_scratchlm(name, tmp_path):
    tok = tokenizers_under_test(name)
    texts = {**TEXTS, **UNSEEN}
    path = tiny_gguf(tok, tmp_path / "tok.gguf")
    encoded = llama(path, 64, [{"op": "tokenize", "text": text} for text in texts.values()], tmp_path, vocab_only=True)
    decoded = llama(path, 64, [{"op": "detokenize", "ids": ids} for ids in encoded], tmp_path, vocab_only=True)
    for (label, text), theirs, back in zip(texts.items(), encoded, decoded):
        if tok.kind == "char" and label in UNSEEN:
            assert theirs == char_ids_llama_cpp_expects(tok, text), label
            if tok.unk_id is not None and label == "apart":  # one unseen character at a time: the same ids
                assert theirs == tok.encode(text)
            continue
        assert theirs == tok.encode(text), label
        assert back == text, label


CHAT = [{"role": "system", "content": "Where is the king?"}, {"role": "user", "content": "床前明月光，"},
        {"role": "assistant", "content": "疑是地上霜。"}, {"role": "user", "content": "举头望明月，"}]


def chat_model(tok, ends: bool):
    """A small random model around `tok`; `ends`: one whose every next token is <|end|> (the final
    norm's output made a constant that only <|end|>'s head row reads), so a reply ends at once."""
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT
    from scratchlm.text.chat import END_TOKEN

    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=32,
                          pos_embedding="rope", activation="gelu_tanh", lm_head_bias=False)).eval()
    if ends:
        with torch.no_grad():
            model.transformer.ln_f.weight.zero_()
            model.transformer.ln_f.bias.fill_(1.0)
            model.lm_head.weight.mul_(0.01)[tok.specials[END_TOKEN]] = 1.0
    return model


@pytest.mark.parametrize("ends", [False, True], ids=["runs-on", "ends"])
@pytest.mark.parametrize("name", ["char", "bpe", "gpt2"])
def test_llama_cpps_chat_completion_renders_our_prompt_and_gives_our_greedy_reply(name, ends, tmp_path):
    """create_chat_completion on the exported file (its tokenizer.chat_template, its <|end|> as the
    end of a turn): the prompt's ids are ChatTemplate.prompt's, and the greedy reply is scratchlm's
    (the text an application shows: control tokens print nothing), stopping where ours stops."""
    from scratchlm.data.conversations import Message
    from scratchlm.generation.generate import generate_ids
    from scratchlm.text.chat import CHAT_TOKENS, END_TOKEN, ChatTemplate

    tok = tokenizers_under_test(name).with_tokens(CHAT_TOKENS)
    template = ChatTemplate(encode=tok.encode, special=tok.specials, bos_id=tok.bos_id)
    model = chat_model(tok, ends)
    export_gguf(model, tok, tmp_path / "chat.gguf", "f32")
    prompt = template.prompt([Message(m["role"], m["content"]) for m in CHAT])
    n = 12
    out = generate_ids(model, torch.tensor([prompt]), greedy=True, max_new_tokens=n, eos_id=tok.specials[END_TOKEN])
    reply = out[0, len(prompt):].tolist()
    stopped = tok.specials[END_TOKEN] in reply
    reply = reply[: reply.index(tok.specials[END_TOKEN])] if stopped else reply
    assert stopped == ends
    [theirs] = llama(tmp_path / "chat.gguf", 64, [{"op": "chat", "messages": CHAT, "n": n}], tmp_path)
    assert theirs["prompt_ids"] == prompt
    # a random model's byte tokens need not form UTF-8: scratchlm shows such bytes as U+FFFD,
    # llama-cpp-python's reply leaves them out
    ours = tok.decode([i for i in reply if i not in tok.special_ids]).replace("\ufffd", "")
    assert theirs["text"] == ours
    assert theirs["finish"] == ("stop" if ends else "length")
