"""`scratchlm export-gguf` without llama.cpp: what it refuses (exit 2, one line, nothing written,
an existing file untouched), and what the file says, read back with the `gguf` package's reader
beside the model's own config (tests/test_gguf_llama_cpp.py runs the files in llama.cpp)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.text.tokenizer import CharTokenizer
from scratchlm.training.checkpoint import save_model_checkpoint

TEXT = "ROMEO: But soft, what light through yonder window breaks?\n床前明月光\n"
BABY = dict(block_size=32, n_layer=2, n_head=2, n_embd=32)


def checkpoint(tmp_path: Path, tokenizer=None, **fields) -> Path:
    tok = tokenizer or CharTokenizer.train([TEXT])
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, **{**BABY, **fields})).eval()
    with torch.no_grad():
        if model.lm_head.bias is not None:
            model.lm_head.bias.normal_()  # a bias that must be folded, or refused
    return save_model_checkpoint(model, tok, tmp_path / "ckpt")


def export(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scratchlm", "export-gguf", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


REFUSED = {
    "relu-gpt2": (dict(activation="relu"), "activation: 'relu' cannot run in llama.cpp: its gpt2 graph"),
    "relu-neox": (dict(activation="relu", pos_embedding="rope"), "its gptneox graph applies GELU"),
    "post-norm": (dict(activation="gelu_tanh", norm_position="post"), "norm_position: 'post' blocks have no llama.cpp"),
    "no-final-norm": (dict(activation="gelu_tanh", final_norm=False), "final_norm: false"),
    "llama-head-bias": (dict(pos_embedding="rope", norm="rmsnorm", activation="swiglu"), "lm_head_bias:"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_llama_cpp_would_compute_otherwise_is_refused_and_nothing_is_written(case, tmp_path):
    fields, said = REFUSED[case]
    ckpt = checkpoint(tmp_path, **fields)
    kept = tmp_path / "kept.gguf"
    kept.write_bytes(b"the user's earlier export")
    for out in (tmp_path / "new.gguf", kept):
        result = export(ckpt, out)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and said in result.stderr
        assert result.stdout == ""
    assert not (tmp_path / "new.gguf").exists() and kept.read_bytes() == b"the user's earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "kept.gguf"]  # no temporary file either


def test_the_relu_refusal_names_the_flags_that_train_a_model_llama_cpp_runs(tmp_path):
    result = export(checkpoint(tmp_path, activation="relu"), tmp_path / "out.gguf")
    assert "--activation gelu_tanh" in result.stderr and "--norm rmsnorm --activation swiglu" in result.stderr


def test_a_name_without_gguf_a_vocabulary_with_the_space_mark_and_no_tokenizer_are_refused(tmp_path):
    ckpt = checkpoint(tmp_path / "a", activation="gelu_tanh")
    result = export(ckpt, tmp_path / "model.bin")
    assert result.returncode == 2 and "give a name ending in .gguf" in result.stderr
    marked = checkpoint(tmp_path / "b", CharTokenizer.train([TEXT + "\u2581"]), activation="gelu_tanh")
    result = export(marked, tmp_path / "marked.gguf")
    assert result.returncode == 2 and "U+2581" in result.stderr and result.stderr.count("\n") == 1
    nul = checkpoint(tmp_path / "c", CharTokenizer.train([TEXT + "\x00"]), activation="gelu_tanh")
    result = export(nul, tmp_path / "nul.gguf")
    assert result.returncode == 2 and "NUL (U+0000)" in result.stderr and result.stderr.count("\n") == 1
    (ckpt / "tokenizer").rename(tmp_path / "elsewhere")
    result = export(ckpt, tmp_path / "bare.gguf")
    assert result.returncode == 2 and "no tokenizer" in result.stderr and result.stderr.count("\n") == 1
    assert not any(p.suffix == ".gguf" or p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_the_folder_of_a_new_file_is_made(tmp_path):
    result = export(checkpoint(tmp_path, activation="gelu_tanh", lm_head_bias=False), tmp_path / "exports" / "today" / "m.gguf")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "exports" / "today" / "m.gguf").read_bytes()[:4] == b"GGUF"


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch, capsys):
    import errno

    import gguf

    from scratchlm.cli.main import main

    ckpt = checkpoint(tmp_path, activation="gelu_tanh", lm_head_bias=False)
    out = tmp_path / "model.gguf"
    out.write_bytes(b"yesterday's export")

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full_disk)
    assert main(["export-gguf", str(ckpt), str(out)]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "cannot write the GGUF file: the disk is full; nothing of it was left" in said
    assert out.read_bytes() == b"yesterday's export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "model.gguf"]


@pytest.mark.parametrize("fields, arch", [
    (dict(activation="gelu_tanh", tie_weights=True, lm_head_bias=False), "gpt2"),
    (dict(activation="gelu", pos_embedding="rope", rope_theta=500.0, lm_head_bias=False), "gptneox"),
    (dict(activation="swiglu", pos_embedding="rope", norm="rmsnorm", lm_head_bias=False, norm_eps=1e-6), "llama"),
])
def test_the_file_holds_the_models_shape_its_vocabulary_and_no_added_bos(fields, arch, tmp_path):
    import gguf

    tok = CharTokenizer.train([TEXT], unk=True)
    ckpt = checkpoint(tmp_path, tok, **fields)
    result = export(ckpt, tmp_path / "m.gguf", "--dtype", "q8_0")
    assert result.returncode == 0, result.stderr
    reader = gguf.GGUFReader(tmp_path / "m.gguf")

    def value(key: str):
        return reader.fields[key].contents()

    config = GPTConfig(vocab_size=tok.vocab_size, **{**BABY, **fields})
    assert value("general.architecture") == arch
    assert value(f"{arch}.context_length") == config.block_size
    assert value(f"{arch}.block_count") == config.n_layer and value(f"{arch}.attention.head_count") == config.n_head
    eps = value(f"{arch}.attention.layer_norm_rms_epsilon" if arch == "llama" else f"{arch}.attention.layer_norm_epsilon")
    assert eps == pytest.approx(config.norm_eps)
    if arch != "gpt2":
        assert value(f"{arch}.rope.freq_base") == config.rope_theta
        assert value(f"{arch}.rope.dimension_count") == config.n_embd // config.n_head
    assert value("tokenizer.ggml.add_bos_token") is False and value("tokenizer.ggml.add_eos_token") is False
    tokens = value("tokenizer.ggml.tokens")
    pieces = {i: piece for piece, i in tok.piece_ids().items()}
    assert tokens == [pieces[i].replace(" ", "\u2581") for i in range(tok.vocab_size)]
    assert value("tokenizer.ggml.unknown_token_id") == tok.unk_id
    assert value("tokenizer.ggml.bos_token_id") == tok.bos_id and value("tokenizer.ggml.eos_token_id") == tok.eos_id
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["token_embd.weight"] == "Q8_0" and types["output_norm.weight"] == "F32"
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert tuple(int(n) for n in embedding.shape) == (config.n_embd, tok.vocab_size)  # GGUF lists (in, out)


def test_export_hf_writes_n_ctx_for_the_converter_of_llama_cpp(tmp_path):
    """llama.cpp's convert_hf_to_gguf.py reads a GPT-2's context from n_ctx (n_positions is
    transformers' name); both hold the model's block_size."""
    import json

    ckpt = checkpoint(tmp_path, activation="gelu_tanh", lm_head_bias=False)
    result = subprocess.run([sys.executable, "-m", "scratchlm", "export-hf", str(ckpt), str(tmp_path / "hf")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["n_ctx"] == config["n_positions"] == BABY["block_size"]
