"""`scratchlm generate` on the command line: the plain loop's continuation printed, bad input refused
in one line, samples, beams, stop strings, a long prompt, a prompt from stdin, the warning for
flags that change nothing, and special tokens printed as transformers prints them."""

from __future__ import annotations

import pytest
import torch

from scratchlm.generation.generate import generate, stream
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

from helpers import plain_loop, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


@pytest.fixture
def char_checkpoint(tmp_path):
    checkpoint = pytest.importorskip("scratchlm.checkpoint")
    tokenizer_module = pytest.importorskip("scratchlm.text.tokenizer")
    tok = tokenizer_module.CharTokenizer("abcdefgh \n")
    model = tiny_model(seed=23, vocab_size=tok.vocab_size)  # a seed whose greedy text varies
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)
    out = checkpoint.save_model_checkpoint(model, tok, tmp_path / "ckpt")
    return out, model, tok


def _cli(argv, capsys):
    from scratchlm.cli.main import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_greedy_prints_prompt_and_the_plain_loops_continuation(char_checkpoint, capsys):
    path, model, tok = char_checkpoint
    ids = plain_loop(model, torch.tensor([tok.encode("abc")]), 25)[0][0, 3:].tolist()
    if tok.eos_id in ids:
        ids = ids[: ids.index(tok.eos_id)]
    want = "abc" + tok.decode(ids) + "\n"
    base = ["generate", "--checkpoint", str(path), "--prompt", "abc", "--max-new-tokens", "25"]
    for extra in (["--greedy"], ["--greedy", "--no-cache"], ["--top-k", "1", "--seed", "3"], ["--temperature", "0"]):
        code, out, err = _cli(base + extra, capsys)
        assert (code, out, err) == (0, want, "")
    code, out, _ = _cli(["generate", "--checkpoint", str(path), "--prompt", "abc", "--greedy", "--max-new-tokens", "25", "--no-echo"], capsys)
    assert out == want[3:]


def test_cli_refuses_bad_input_with_one_error_line(char_checkpoint, capsys, tmp_path):
    path, _, _ = char_checkpoint
    base = ["generate", "--checkpoint", str(path)]
    for argv, needle in [
        (["--prompt", "a", "--max-new-tokens", "-1"], "--max-new-tokens"),
        (["--prompt", "a", "--max-new-tokens", "1000000"], "--max-new-tokens"),
        (["--prompt", "abxyz"], "'x', 'y', 'z'"),  # characters the char tokenizer does not know, named
        (["--prompt", "a", "--top-p", "0"], "top_p"),
        (["--prompt-file", str(tmp_path / "missing.txt")], "missing.txt"),
    ]:
        code, out, err = _cli(base + argv, capsys)
        assert code == 2 and out == "" and err.startswith("error: ") and needle in err and err.count("\n") == 1
    code, _, err = _cli(["generate", "--checkpoint", str(tmp_path / "nowhere"), "--prompt", "a"], capsys)
    assert code == 2 and "nowhere" in err


def test_cli_samples_beams_stop_and_long_prompt(char_checkpoint, capsys, tmp_path):
    path, model, tok = char_checkpoint
    base = ["generate", "--checkpoint", str(path), "--max-new-tokens", "20"]
    code, out, _ = _cli(base + ["--prompt", "ab", "--num-samples", "3", "--seed", "1"], capsys)
    assert code == 0 and out.count("--- sample ") == 3
    code, again, _ = _cli(base + ["--prompt", "ab", "--num-samples", "3", "--seed", "1"], capsys)
    assert again == out
    code, out, _ = _cli(base + ["--prompt", "ab", "--beams", "3", "--num-samples", "2"], capsys)
    assert code == 0 and out.count("logprob") == 2

    full = plain_loop(model, torch.tensor([tok.encode("ab")]), 20)[0][0, 2:].tolist()
    text = tok.decode(full[: full.index(tok.eos_id)] if tok.eos_id in full else full)
    assert len(text) >= 8  # the fixture's model runs on long enough for a stop string inside
    stop = text[5:7].replace("\n", "\\n")  # typed on a command line, a newline is \n
    code, out, _ = _cli(base + ["--prompt", "ab", "--greedy", "--stop", stop], capsys)
    assert out == "ab" + text[: text.find(text[5:7])] + "\n"

    prompt_file = tmp_path / "long.txt"
    prompt_file.write_text("abcdefgh" * 4, encoding="utf-8")  # 32 tokens, block_size 16
    code, out, err = _cli(base + ["--prompt-file", str(prompt_file), "--greedy"], capsys)
    assert code == 0 and err.startswith("warning: ") and "16" in err and out.startswith("abcdefgh" * 4)


@pytest.mark.slow
def test_cli_reads_the_prompt_from_stdin(char_checkpoint):
    import subprocess
    import sys

    path, model, tok = char_checkpoint
    ids = plain_loop(model, torch.tensor([tok.encode("hag\n")]), 10)[0][0, 4:].tolist()
    if tok.eos_id in ids:
        ids = ids[: ids.index(tok.eos_id)]
    run = subprocess.run(
        [sys.executable, "-m", "scratchlm", "generate", "--checkpoint", str(path), "--greedy", "--max-new-tokens", "10"],
        input="hag\n", capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "hag\n" + tok.decode(ids) + "\n"


def test_generates_flags_are_the_generation_records_fields_with_their_defaults():
    """One flag per field of GenerationSettings and SamplingOptions (the records read directly
    here), each starting at the record's default; max_new_tokens starts at 200 on the command line."""
    import dataclasses

    from scratchlm.cli.main import build_parser
    from scratchlm.generation.sampling import SamplingOptions
    from scratchlm.generation.settings import GenerationSettings

    records = {f.name: f.default for f in dataclasses.fields(GenerationSettings) if f.name != "sampling"}
    records.update({f.name: f.default for f in dataclasses.fields(SamplingOptions)})
    records.update(max_new_tokens=200, stop=[])  # --stop gathers a list
    args = vars(build_parser().parse_args(["generate", "--checkpoint", "run"]))
    assert {name: args[name] for name in records} == records
    others = set(args) - set(records)
    assert others == {"checkpoint", "prompt", "prompt_file", "no_cache", "no_echo", "device", "dtype",
                      "command", "debug", "run"}, others  # how to load and run the model, not settings


@pytest.mark.parametrize("flags, words", [
    ([], None),
    (["--temperature", "0.7", "--top-k", "5", "--seed", "1"], None),  # sampling: all of them count
    (["--greedy", "--top-k", "5", "--seed", "1"], ["--top-k, --seed have no effect with greedy"]),
    (["--temperature", "0", "--min-p", "0.1"], ["--min-p has no effect with greedy"]),
    (["--greedy", "--temperature", "0.5"], ["--temperature has no effect with greedy"]),
    (["--greedy", "--repetition-penalty", "1.3"], None),  # the penalty does move greedy's argmax
    (["--beams", "3", "--top-p", "0.9", "--repetition-penalty", "1.2"],
     ["--top-p, --repetition-penalty have no effect with --beams"]),
    (["--beams", "3", "--temperature", "0"], ["--temperature has no effect with --beams"]),
    (["--beams", "3", "--length-penalty", "0.5"], None),
    (["--length-penalty", "0.5"], ["--length-penalty applies to beam search only"]),
    (["--stop", "", "--stop", "x"], ["an empty --stop matches nothing"]),
])
def test_generate_warns_of_flags_that_change_nothing(flags, words):
    """One warning line naming each flag the chosen decoding cannot use (not an error: the text
    is still what was asked for), and none where every flag counts."""
    from scratchlm.cli.main import build_parser, ignored_generate_flags

    args = build_parser().parse_args(["generate", "--checkpoint", "run", *flags])
    warning = ignored_generate_flags(args)
    if words is None:
        assert warning is None
    else:
        assert warning is not None and all(w in warning for w in words), warning



# ---------------------------------------------------------------- special tokens in generated text


def _bos_choosing_model(tok) -> GPT:
    """A random model whose greedy continuation of "ab" holds <|bos|> between characters (seed
    23, found by trying seeds; the test checks that it still does)."""
    torch.manual_seed(23)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16,
                          pos_embedding="learned", lm_head_bias=False)).eval()
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)
        model.transformer.wpe.weight.normal_(0.0, 1.0)
    return model


def test_generated_text_leaves_special_tokens_out_as_the_exported_model_does(tmp_path, capsys):
    """A <|bos|> the model chooses stays in the ids but not in the text: generate, stream and the
    CLI print what transformers prints for the exported model, decode(skip_special_tokens=True)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scratchlm.checkpoint import save_model_checkpoint
    from scratchlm.hf.interop import export_hf
    from scratchlm.text.tokenizer import BOS, CharTokenizer

    tok = CharTokenizer("abcd ")
    model = _bos_choosing_model(tok)
    out = generate(model, tok, "ab", max_new_tokens=20, greedy=True)
    assert out.ids.count(tok.bos_id) >= 2 and out.finish_reasons == ["length"]  # the case in question
    export_hf(model, tmp_path / "hf", tok)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    prompt = hf_tok("ab", add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        new = hf.generate(prompt, max_new_tokens=20, do_sample=False)[0, prompt.shape[1]:].tolist()
    assert new == out.ids
    assert out.text == hf_tok.decode(new, skip_special_tokens=True) and BOS not in out.text
    assert "".join(stream(model, tok, "ab", max_new_tokens=20, greedy=True)) == out.text
    save_model_checkpoint(model, tok, tmp_path / "ckpt")
    capsys.readouterr()  # transformers' own progress lines
    code, printed, err = _cli(["generate", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "ab", "--greedy",
                               "--max-new-tokens", "20"], capsys)
    assert (code, printed, err) == (0, "ab" + hf_tok.decode(new, skip_special_tokens=True) + "\n", "")
