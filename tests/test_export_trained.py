"""The whole way out and back, from the command line, for models that were really trained: each
training preset (changed only in steps and data) trains a model of one of the three exported
architectures; `scratchlm export-hf` writes it; transformers loads it offline with
AutoModelForCausalLM and AutoTokenizer and computes the same logits (1e-4); `pipeline` with its
default arguments, and with do_sample=False, writes the text `scratchlm generate --greedy` prints;
and `scratchlm import-hf` of the export gives the same logits back."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchlm.checkpoint import load_model

transformers = pytest.importorskip("transformers")

WORDS = "the king speaks to a queen of night and day my lord ROMEO: JULIET: thou art".split()

# preset, extra flags, the architecture transformers must load it as
RUNS = {
    "gpt2": ("smoke", ["--vocab_size", "300", "--block_size", "48"], "GPT2LMHeadModel"),
    "gpt_neox": ("shakespeare-char", [], "GPTNeoXForCausalLM"),  # the README's default run, as it is
    "llama": ("shakespeare-char-fast", ["--norm", "rmsnorm", "--activation", "swiglu", "--no-mlp_bias",
                                        "--no-proj_bias", "--no-lm_head_bias"], "LlamaForCausalLM"),  # RMSNorm: no beta to fold into
}


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "scratchlm", *map(str, args)], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


@pytest.fixture(scope="module")
def offline_env(tmp_path_factory):
    return {**os.environ, "SCRATCHLM_CACHE": str(tmp_path_factory.mktemp("cache")), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "words.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(800)) + "\n",
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("arch", RUNS)
def test_a_trained_run_exports_loads_in_transformers_and_comes_back(tmp_path, arch, text_file, offline_env,
                                                                    monkeypatch):
    preset, flags, hf_class = RUNS[arch]
    run = tmp_path / "run"
    _cli("train", "--preset", preset, "--data", text_file, "--out_dir", run, "--max_steps", 30, "--eval_interval", 0,
         "--sample_tokens", 0, "--progress", "quiet", "--threads", 1, *flags, env=offline_env)
    _cli("export-hf", run, tmp_path / "hf", env=offline_env)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert type(hf).__name__ == hf_class
    ours, tok, _ = load_model(run)
    ours.eval()

    # logits on text the tokenizers agree on
    sample = text_file.read_text(encoding="utf-8")[:400]
    ids = tok.encode(sample)[: ours.config.block_size]
    assert hf_tok(sample, add_special_tokens=False)["input_ids"][: len(ids)] == ids
    idx = torch.tensor([ids])
    with torch.no_grad():
        want = ours(idx)[0]
        torch.testing.assert_close(hf(input_ids=idx).logits, want, atol=1e-4, rtol=1e-4)
    assert want.std() > 0.5  # trained: the logits are far from a fresh model's near-uniform ones

    # greedy text: the pipeline's defaults (generation_config.json) and do_sample=False against the CLI
    prompt = "ROMEO: the king"
    room = ours.config.block_size - len(tok.encode(prompt))
    cli_text = _cli("generate", "--checkpoint", run, "--prompt", prompt, "--greedy", "--max-new-tokens", room,
                    env=offline_env).stdout
    assert cli_text.endswith("\n")
    pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), device="cpu")
    assert pipe(prompt)[0]["generated_text"] == cli_text[:-1]
    assert pipe(prompt, do_sample=False)[0]["generated_text"] == cli_text[:-1]
    assert len(cli_text) > len(prompt) + 10

    # and back: import-hf gives the same logits
    _cli("import-hf", tmp_path / "hf", tmp_path / "back", env=offline_env)
    back, back_tok, _ = load_model(tmp_path / "back")
    assert back_tok is not None and back_tok.encode(sample) == tok.encode(sample)
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(idx)[0], want, atol=1e-5, rtol=1e-5)
