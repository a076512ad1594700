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
from scratchlm.checkpoint import save_model_checkpoint

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


def earlier_export(path: Path) -> bytes:
    """A GGUF file that export-gguf wrote before (of a small random model); its bytes."""
    from scratchlm.gguf.export import export_gguf

    tok = CharTokenizer.train([TEXT])
    torch.manual_seed(1)
    export_gguf(GPT(GPTConfig(vocab_size=tok.vocab_size, activation="gelu_tanh", lm_head_bias=False, **BABY)), tok, path)
    return path.read_bytes()


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
    before = earlier_export(kept)
    for out in (tmp_path / "new.gguf", kept):
        result = export(ckpt, out)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and said in result.stderr
        assert result.stdout == ""
    assert not (tmp_path / "new.gguf").exists() and kept.read_bytes() == before
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


def gguf_not_ours(path: Path) -> bytes:
    """A well-formed GGUF file that scratchlm did not write (no exported_by key); its bytes."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("someone else's model")
    writer.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def test_only_its_own_earlier_export_is_replaced(tmp_path):
    """The output rules of every other command, for one file: a file export-gguf did not write
    (notes that happen to end in .gguf, a GGUF from elsewhere, a symlink to one) is refused with one
    line naming the way out, and kept byte for byte; its own earlier export is replaced."""
    ckpt = checkpoint(tmp_path, activation="gelu_tanh", lm_head_bias=False)
    notes = tmp_path / "notes.gguf"
    notes.write_text("my notes, not a model\n", encoding="utf-8")
    other = tmp_path / "other.gguf"
    theirs = gguf_not_ours(other)
    linked = tmp_path / "linked.gguf"
    linked.symlink_to(other)
    for out, forced in ((notes, False), (other, False), (linked, False), (notes, True)):
        result = export(ckpt, out, *(["--force"] if forced else []))
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and "did not write" in result.stderr, result.stderr
        assert "choose another OUT, or move that file away first" in result.stderr
    assert notes.read_text(encoding="utf-8") == "my notes, not a model\n" and other.read_bytes() == theirs
    mine = tmp_path / "mine.gguf"
    before = earlier_export(mine)
    result = export(ckpt, mine, "--dtype", "f16")
    assert result.returncode == 0, result.stderr
    assert mine.read_bytes() != before and "f16" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "linked.gguf", "mine.gguf", "notes.gguf", "other.gguf"]


def test_out_inside_the_checkpoint_and_all_q8_0_without_q8_0_are_refused(tmp_path):
    ckpt = checkpoint(tmp_path, activation="gelu_tanh", lm_head_bias=False)
    listed = sorted(p.name for p in ckpt.rglob("*"))
    for args, said in (((ckpt / "model.gguf",), "lies in this command's own input"),
                       ((ckpt / "tokenizer" / "x.gguf",), "lies in this command's own input"),
                       ((tmp_path / "m.gguf", "--all-q8_0"), "--all-q8_0 is for --dtype q8_0 (got --dtype f32)")):
        result = export(ckpt, *args)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and said in result.stderr, result.stderr
    assert sorted(p.name for p in ckpt.rglob("*")) == listed and not (tmp_path / "m.gguf").exists()


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
    before = earlier_export(out)

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full_disk)
    assert main(["export-gguf", str(ckpt), str(out)]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "cannot write the GGUF file: the disk is full; nothing of it was left" in said
    assert out.read_bytes() == before
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


def tensor(reader, name: str):
    return next(t for t in reader.tensors if t.name == name)


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_the_position_table_stays_float32_and_exact_in_every_form(dtype, tmp_path):
    """llama.cpp's converter keeps GPT-2's position table float32 (it is looked up, not multiplied):
    the file holds the model's learned table to the bit, whatever --dtype says of the matrices."""
    import gguf
    import numpy as np

    from scratchlm.gguf.export import export_gguf

    tok = CharTokenizer.train([TEXT])
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, activation="gelu_tanh", lm_head_bias=False, **BABY)).eval()
    export_gguf(model, tok, tmp_path / "m.gguf", dtype)
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    table = tensor(reader, "position_embd.weight")
    assert table.tensor_type.name == "F32"
    wpe = model.transformer.wpe.weight.detach().numpy()
    assert np.array_equal(np.asarray(table.data).reshape(wpe.shape), wpe)
    assert tensor(reader, "blk.0.attn_qkv.weight").tensor_type.name == "F16"  # the matrices did take the form


def test_a_tied_gpt_neox_model_gets_a_head_of_its_own(tmp_path):
    """llama.cpp's gptneox graph reads output.weight and has no tied form: a tied model's head is
    written out, equal to its token table."""
    import gguf
    import numpy as np

    from scratchlm.gguf.export import export_gguf

    tok = CharTokenizer.train([TEXT])
    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, pos_embedding="rope", activation="gelu_tanh", tie_weights=True,
                          lm_head_bias=False, **BABY)).eval()
    export_gguf(model, tok, tmp_path / "m.gguf", "f32")
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert reader.fields["general.architecture"].contents() == "gptneox"
    wte = model.transformer.wte.weight.detach().numpy()[: tok.vocab_size]
    head = np.asarray(tensor(reader, "output.weight").data).reshape(wte.shape)
    assert np.array_equal(head, wte)


@pytest.mark.parametrize("option", [{"byte_fallback": True}, {"dropout": 0.1}, {"continuing_subword_prefix": "##"},
                                    {"end_of_word_suffix": "</w>"}, {"type": "WordPiece"}, "not-gpt2-split"])
def test_a_bpe_that_llama_cpps_gpt2_pre_tokenizer_would_encode_otherwise_is_refused(option):
    """llama.cpp's gpt-2 tokenizer is plain byte-level BPE over GPT-2's split: byte fallback,
    dropout, subword prefixes or suffixes, another model type or another split encode otherwise."""
    from scratchlm.errors import UserError
    from scratchlm.gguf.vocab import _bpe_merges

    plain = {"model": {"type": "BPE", "merges": ["a b", ["ab", "c"]], "byte_fallback": False}}
    assert _bpe_merges(plain, gpt2_split=True) == [("a", "b"), ("ab", "c")]
    changed = {"model": {**plain["model"], **(option if isinstance(option, dict) else {})}}
    with pytest.raises(UserError, match="does not split text the way GPT-2's byte-level BPE does"):
        _bpe_merges(changed, gpt2_split=option != "not-gpt2-split")
