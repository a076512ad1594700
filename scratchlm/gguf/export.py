"""`scratchlm export-gguf`: a trained model and its tokenizer as one GGUF file for llama.cpp.

Written with the `gguf` package (the library llama.cpp's own converter writes with). What goes in:
the architecture's keys and tensors (scratchlm.gguf.tensors), the tokenizer (scratchlm.gguf.vocab),
the run's name. The weights in one of four forms: `f32` (exactly the model's numbers), `f16`,
`bf16`, or `q8_0` (blocks of 32 numbers sharing one scale, about a quarter of f32's size);
vectors (norms and biases) and the position table stay float32 in every form, as llama.cpp's
converter keeps them. Under q8_0 two kinds of matrix are written as f16 instead: one whose rows
are not a whole number of 32-number blocks, and one that llama.cpp's AMX kernels would multiply
by (scratchlm.gguf.tensors.amx_takes), which crash on Intel CPUs with AMX unless the user asks for
every matrix in q8_0 (all_q8_0). What llama.cpp cannot compute is refused before anything is
written; the file appears whole or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scratchlm.errors import UserError
from scratchlm.fileio import atomic_path

DTYPES = ("f32", "f16", "bf16", "q8_0")
EXPORTED_BY = "scratchlm.exported_by"
"""The file's own key (llama.cpp passes over keys it does not know) saying which command wrote it:
an existing OUT is replaced only when it holds this key (see check_replaceable)."""
COMMAND = "scratchlm export-gguf"
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


def _matrix_form(name: str, shape: tuple[int, ...], dtype: str, products: set[str], all_q8_0: bool) -> str:
    """The form one float32 tensor is written in: `dtype`, except that vectors and the position
    table stay f32, and that under q8_0 a matrix is f16 where q8_0 cannot hold its rows ("rows")
    or where llama.cpp's AMX kernels would take it ("amx")."""
    from scratchlm.gguf.tensors import amx_takes

    if len(shape) == 1 or name == "position_embd.weight":
        return "f32"
    if dtype != "q8_0":
        return dtype
    if shape[-1] % 32 != 0:
        return "rows"
    if not all_q8_0 and amx_takes(shape, name in products):
        return "amx"
    return "q8_0"


def _add_tensor(writer: Any, name: str, values: np.ndarray, form: str) -> None:
    import gguf

    if form == "f32":
        writer.add_tensor(name, values)
    elif form in ("f16", "rows", "amx"):
        writer.add_tensor(name, values.astype(np.float16))
    else:
        qtype = gguf.GGMLQuantizationType.BF16 if form == "bf16" else gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)


def written_by_us(path: Path) -> bool:
    """Whether `path` is a GGUF file that `scratchlm export-gguf` wrote (its EXPORTED_BY key)."""
    import gguf

    try:
        field = gguf.GGUFReader(path).fields.get(EXPORTED_BY)
        return field is not None and field.contents() == COMMAND
    except Exception:  # not a GGUF file, or a damaged one: the reader raises whatever its parsing met
        return False


def check_replaceable(out: Path, flag: str = "OUT") -> None:
    """Refuse, before any work, to replace a file that this command did not write: a user's own
    notes.gguf, a GGUF from elsewhere, an export from before the key existed. Its own earlier
    export is replaced whole."""
    out = Path(out).expanduser()
    if out.is_file() and not written_by_us(out):
        raise UserError(f"{flag} {out}: a file that `{COMMAND}` did not write; it replaces only its own earlier "
                        f"exports, so that nothing else is lost: choose another {flag}, or move that file away first")


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


def export_gguf(model: Any, tokenizer: Any, out: Path | str, dtype: str = "f32", name: str | None = None,
                all_q8_0: bool = False) -> GGUFExport:
    """Write `model` and `tokenizer` to the GGUF file `out` in `dtype` (one of DTYPES); a
    UserError, before anything is written, for what llama.cpp cannot run as scratchlm does.
    all_q8_0: under q8_0, also quantize the matrices llama.cpp's AMX kernels would take."""
    import gguf

    from scratchlm.gguf.tensors import gguf_arch, gguf_tensors, product_weights, write_hparams
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
    writer.add_string(EXPORTED_BY, COMMAND)
    writer.add_file_type(_file_type(dtype))
    if dtype == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_hparams(writer, model.config, arch, n_vocab)
    vocab.write(writer)
    products = product_weights(tensors)
    forms = {key: _matrix_form(key, tuple(value.shape), dtype, products, all_q8_0) for key, value in tensors.items()}
    for key, value in tensors.items():
        _add_tensor(writer, key, value.numpy(), forms[key])
    notes = vocab.notes + _notes(model.config, arch)
    counts = list(forms.values())
    if counts.count("rows"):
        notes.append(f"{counts.count('rows')} matrices have rows that are not a whole number of 32-number blocks; "
                     "they are f16")
    if counts.count("amx"):
        notes.append(f"{counts.count('amx')} of {len(products)} matrix products are kept f16, {counts.count('q8_0')} "
                     "matrices are q8_0: llama.cpp's AMX kernels (Intel Xeon 4th generation and later, with llama.cpp "
                     "built for the CPU) crash on q8_0 products whose two sides are multiples of 32; --all-q8_0 "
                     "quantizes them too, for a smaller file that such a CPU cannot run")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, durable=True) as tmp:
        try:
            writer.write_header_to_file(path=tmp)
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()  # also when a write failed: no open file is left on the removed name
    return GGUFExport(out, arch, vocab.model, n_vocab, model.config.block_size, out.stat().st_size, notes)
