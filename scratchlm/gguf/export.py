"""`scratchlm export-gguf`: a trained model and its tokenizer as one GGUF file for llama.cpp.

Written with the `gguf` package (the library llama.cpp's own converter writes with). What goes in:
the architecture's keys and tensors (scratchlm.gguf.tensors), the tokenizer (scratchlm.gguf.vocab),
the run's name. The weights in one of four forms: `f32` (exactly the model's numbers), `f16`,
`bf16`, or `q8_0` (blocks of 32 numbers sharing one scale, about a quarter of f32's size);
vectors (norms and biases) and the position table stay float32 in every form, as llama.cpp's
converter keeps them, and a matrix whose rows are not a whole number of 32-number blocks is
written as f16 under q8_0. What llama.cpp cannot compute is refused before anything is written;
the file appears whole or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scratchlm.errors import UserError
from scratchlm.fileio import atomic_path

DTYPES = ("f32", "f16", "bf16", "q8_0")
GELU_TANH_GAP = 4.8e-4  # the most exact GELU and its tanh form differ, over all inputs (at x = 2.7)


@dataclass
class GGUFExport:
    """What export_gguf wrote: the file, llama.cpp's architecture, the tokenizer's form, its
    size in tokens, the context, bytes on disk, and notes to pass on to the user."""

    path: Path
    arch: str
    tokenizer: str
    n_vocab: int
    context: int
    nbytes: int
    notes: list[str] = field(default_factory=list)


def _file_type(dtype: str) -> int:
    import gguf

    return {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype]


def _add_tensor(writer: Any, name: str, values: np.ndarray, dtype: str) -> bool:
    """Add one float32 tensor in `dtype`; False when q8_0 was asked but the rows do not split into blocks."""
    import gguf

    if values.ndim == 1 or name == "position_embd.weight" or dtype == "f32":
        writer.add_tensor(name, values)
        return True
    if dtype == "f16" or (dtype == "q8_0" and values.shape[-1] % 32 != 0):
        writer.add_tensor(name, values.astype(np.float16))
        return dtype == "f16"
    qtype = gguf.GGMLQuantizationType.BF16 if dtype == "bf16" else gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    return True


def _notes(config: Any, arch: str) -> list[str]:
    notes = []
    if config.activation == "gelu" and arch != "llama":
        notes.append(f"the model's MLP uses exact GELU; llama.cpp's {arch} graph computes GELU's tanh form, which "
                     f"differs by at most {GELU_TANH_GAP} per activation (with --activation gelu_tanh only llama.cpp's 16-bit "
                     "GELU table differs: logits within about 1e-3 either way)")
    notes.append(f"the model reads at most {config.block_size} tokens; llama.cpp makes room for at least 256, so keep "
                 f"prompt plus new tokens within {config.block_size} (llama-completion -c {config.block_size} -n N, or "
                 "max_tokens in llama-cpp-python)")
    return notes


def export_gguf(model: Any, tokenizer: Any, out: Path | str, dtype: str = "f32", name: str | None = None) -> GGUFExport:
    """Write `model` and `tokenizer` to the GGUF file `out` in `dtype` (one of DTYPES); a
    UserError, before anything is written, for what llama.cpp cannot run as scratchlm does."""
    import gguf

    from scratchlm.gguf.tensors import gguf_arch, gguf_tensors, write_hparams
    from scratchlm.gguf.vocab import gguf_vocab
    from scratchlm.machine.flops import count_params
    from scratchlm.machine.memory import check_fits, footprint

    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    out = Path(out)
    arch = gguf_arch(model.config)
    vocab = gguf_vocab(tokenizer)
    # besides the model: float32 copies of its weights, and the file's bytes of them
    check_fits(footprint(model.config, param_bytes=8), "cpu", f"exporting a model of "
               f"{count_params(model.config)['total']:,} parameters", "the memory other programs hold")
    n_vocab = len(vocab.tokens)
    tensors = gguf_tensors(model, arch, n_vocab)
    writer = gguf.GGUFWriter(None, arch)
    writer.add_name(name or "scratchlm model")
    writer.add_file_type(_file_type(dtype))
    if dtype == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_hparams(writer, model.config, arch, n_vocab)
    vocab.write(writer)
    kept = [_add_tensor(writer, key, value.numpy(), dtype) for key, value in tensors.items()]
    notes = vocab.notes + _notes(model.config, arch)
    if not all(kept):
        notes.append(f"{kept.count(False)} matrices have rows that are not a whole number of 32-number blocks; they "
                     "are f16, the rest q8_0")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, durable=True) as tmp:
        try:
            writer.write_header_to_file(path=tmp)
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()  # also when a write failed: no open file is left on the removed name
    return GGUFExport(out, arch, vocab.model, n_vocab, model.config.block_size, out.stat().st_size, notes)
