"""Hugging Face GPT-2 interop: bring a `GPT2LMHeadModel` in, send a scratchlm model out.

GPT-2's layout and ours differ in one way only: Hugging Face stores its four projection matrices
(`attn.c_attn`, `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`) as `Conv1D` weights of shape (in, out),
while a torch `nn.Linear` holds (out, in). Every other tensor keeps its name and shape, because our
modules carry GPT-2's names. So the conversion is: transpose those four, copy the rest.

Not every scratchlm model is a GPT-2. Export works when the architecture is representable: position
vectors added to the token embeddings, LayerNorm, a ReLU/GELU/GELU-tanh MLP, pre-norm blocks, and the
final norm ln_f before the head (final_norm off is refused). Fixed sinusoidal positions become GPT-2's
position table filled with the same values, and `none` a table of
zeros: the function is the same (though transformers would train that table if fine-tuned). Biases
GPT-2 has and we switched off are written as zeros (same function); an lm_head bias GPT-2 lacks is
dropped if it is zero and refused otherwise. RoPE models export to GPT-NeoX or Llama instead
(scratchlm.hf.hf_rotary); what no architecture computes (post-norm, RMSNorm or SwiGLU with added
positions, ...) is refused with a `UserError` naming the fields and the flags that would do.

Nothing here imports `transformers`: a Hugging Face model directory is just config.json plus
safetensors, and an in-memory HF model is read through `.state_dict()` and `.config`.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from scratchlm.errors import UserError, check_folder_path, read_failure
from scratchlm.hf.hf_rotary import GPT2
from scratchlm.machine.flops import count_params
from scratchlm.machine.memory import check_fits, footprint
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.checkpoint import WEIGHTS_FILE, quiet_torch_load, staged_dir
from scratchlm.text.chat import has_chat_tokens, jinja_template

# Weights that Hugging Face's Conv1D stores as (in, out); nn.Linear wants (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

# HF activation name -> ours. gelu_new, gelu_pytorch_tanh and gelu_fast are all the tanh form of
# GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written three ways.
ACTIVATIONS_FROM_HF = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}
# ours -> HF; all three are in transformers' ACT2FN table.
ACTIVATIONS_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}

# GPT2Config's defaults, for config.json files that leave a field out.
HF_GPT2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}

# Buffers that old GPT-2 checkpoints saved next to the weights: the causal mask and the value used
# to fill it. They hold no learned numbers; our model builds its mask itself.
_MASK_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")

WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
PICKLE_WEIGHTS_FILE = "pytorch_model.bin"


# --------------------------------------------------------------------------------------------
# Import: Hugging Face -> scratchlm
# --------------------------------------------------------------------------------------------


def gpt_config_from_hf(hf_config: Any) -> GPTConfig:
    """Translate a GPT-2 config (a `GPT2Config` or its dict) into a GPTConfig.

    Switches that change the function computed are refused, naming the field:
    `add_cross_attention` (an encoder-decoder block), `scale_attn_weights=false` (no 1/sqrt(hs)),
    `scale_attn_by_inverse_layer_idx` (scores divided by layer index + 1), and activations other
    than GELU/GELU-tanh/ReLU. `reorder_and_upcast_attn` only changes the order and precision of
    the score computation under mixed precision, not the math, so it is accepted and dropped.
    """
    raw = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    hf = {**HF_GPT2_DEFAULTS, **raw}
    if hf.get("model_type", "gpt2") != "gpt2":
        raise UserError(f"model_type: {hf['model_type']!r} is not one scratchlm computes; it imports gpt2, gpt_neox "
                        "and llama")
    if hf["add_cross_attention"]:
        raise UserError("add_cross_attention: this GPT-2 has cross-attention layers, which scratchlm's decoder-only model lacks")
    if not hf["scale_attn_weights"]:
        raise UserError("scale_attn_weights: false means scores are not divided by sqrt(head size); scratchlm always divides")
    if hf["scale_attn_by_inverse_layer_idx"]:
        raise UserError("scale_attn_by_inverse_layer_idx: scores scaled by 1/(layer+1) are not something scratchlm computes")
    activation = hf["activation_function"]
    if activation not in ACTIVATIONS_FROM_HF:
        raise UserError(
            f"activation_function: {activation!r} has no scratchlm equivalent; supported: {', '.join(ACTIVATIONS_FROM_HF)}"
        )
    n_positions = raw.get("n_positions", raw.get("n_ctx", hf["n_positions"]))
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        block_size=n_positions,
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        n_inner=hf["n_inner"],
        # HF has three dropout rates, we have one; it only matters when training further
        dropout=float(max(hf["resid_pdrop"], hf["embd_pdrop"], hf["attn_pdrop"])),
        pos_embedding="learned",
        norm="layernorm",
        norm_eps=float(hf["layer_norm_epsilon"]),
        activation=ACTIVATIONS_FROM_HF[activation],
        norm_position="pre",
        tie_weights=bool(hf["tie_word_embeddings"]),
        qkv_bias=True,
        proj_bias=True,
        mlp_bias=True,
        lm_head_bias=False,
        init="gpt2",
    )


def gpt_from_hf(hf_model_or_state_dict: Any, hf_config: Any = None) -> GPT:
    """A scratchlm GPT (eval mode, float32) holding the weights of a Hugging Face GPT-2.

    Pass a `GPT2LMHeadModel` (its `.config` is used), or a state dict plus its config. Keys may
    carry the `transformer.` prefix (GPT2LMHeadModel) or not (GPT2Model, as on the Hub).
    """
    if hasattr(hf_model_or_state_dict, "state_dict"):
        state = hf_model_or_state_dict.state_dict()
        if hf_config is None:
            hf_config = hf_model_or_state_dict.config
    else:
        state = dict(hf_model_or_state_dict)
    if hf_config is None:
        raise UserError("a GPT-2 state dict needs its config (config.json) to be imported")
    return _import_checked(gpt_config_from_hf(hf_config), "the GPT-2 config", lambda: state, _state_dict_from_hf)


def _state_dict_from_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    ours: dict[str, torch.Tensor] = {}
    unexpected = []
    for key, tensor in state.items():
        if key.endswith(_MASK_BUFFER_SUFFIXES):
            continue
        if key == "lm_head.weight":
            ours[key] = tensor
            continue
        name = key.removeprefix("transformer.")
        if not (name.startswith(("wte.", "wpe.", "ln_f.")) or name.startswith("h.")):
            unexpected.append(key)
            continue
        if name.endswith(CONV1D_SUFFIXES):
            tensor = tensor.t()  # Conv1D (in, out) -> Linear (out, in)
        ours["transformer." + name] = tensor
    if unexpected:
        raise UserError(f"weights {', '.join(unexpected[:5])} are not part of a GPT-2 language model; cannot import them")
    if config.tie_weights:
        # one matrix serves both ends; a stored lm_head.weight is a copy of it (or stale), so use wte
        ours["lm_head.weight"] = ours.get("transformer.wte.weight")
    elif "lm_head.weight" not in ours:
        raise UserError("tie_word_embeddings: false, but the weights hold no lm_head.weight; the model is incomplete")
    return {k: v for k, v in ours.items() if v is not None}


def _import_checked(config: GPTConfig, source: str, read_state: Callable[[], Mapping[str, torch.Tensor]],
                    convert: Callable[[Mapping[str, torch.Tensor], GPTConfig], dict[str, torch.Tensor]]) -> GPT:
    """The one import sequence (gpt_from_hf, import_hf_dir): the config's model checked against
    memory before a weight is read (`read_state`), the weights' layers counted against the config
    before a model of its size is built, then converted (`convert`) and built, names and shapes
    checked first."""
    check_import_fits(config, source)
    state = read_state()
    _check_layer_count(state, config, source)
    return _built_checked(config, convert(state, config))


def check_import_fits(config: GPTConfig, source: str) -> None:
    """Refuse, before a weight is read, a config whose model cannot fit in memory: the weights as
    read (at most float32) and the model's float32 copy, 8 bytes a parameter."""
    params = count_params(config)["total"]
    check_fits(footprint(config, param_bytes=8), "cpu", f"importing a model of {params:,} parameters",
               f"vocab_size, n_embd, n_layer or n_inner in {source} (do they describe these weights?)")


_LAYER_KEY = re.compile(r"(?:^|\.)(?:h|layers)\.(\d+)\.")  # GPT-2's h.N., GPT-NeoX's and Llama's layers.N.


def _check_layer_count(state: Mapping[str, Any], config: GPTConfig, source: str) -> None:
    """The layers the weights hold are the layers the config asks for, checked before a model of
    the config's size is built (a config asking for a million layers would build for minutes)."""
    found = {int(m.group(1)) for key in state for m in [_LAYER_KEY.search(key)] if m}
    if found != set(range(config.n_layer)):
        held = f"layers {min(found)}..{max(found)} ({len(found)} in all)" if found else "no layers"
        raise UserError(f"{source} asks for {config.n_layer:,} layers, but the weights hold {held}; the config and "
                        "the weights do not belong together")


def _built_checked(config: GPTConfig, state: dict[str, torch.Tensor]) -> GPT:
    """A model of `config` holding `state` (eval mode), the names and shapes compared on a model
    of the meta device first, so a mismatch costs no memory."""
    with torch.device("meta"):
        skeleton = GPT(config)
    _check_names_and_shapes(skeleton, state)
    model = GPT(config)
    model.load_state_dict(state, strict=True)  # copy_ also converts fp16/bf16 weights to float32
    return model.eval()


def _check_names_and_shapes(model: GPT, state: dict[str, torch.Tensor]) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise UserError(
            "the GPT-2 weights do not match their config: "
            + (f"missing {', '.join(missing[:5])}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unexpected {', '.join(extra[:5])}" if extra else "")
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            got, want = tuple(tensor.shape), tuple(expected[key].shape)
            if key.endswith(CONV1D_SUFFIXES):  # name the shapes as the file stores them: Conv1D is (in, out)
                got, want = got[::-1], want[::-1]
            raise UserError(f"{key}: shape {got} in the weights, {want} from config.json")


def read_hf_weights(directory: Path | str) -> dict[str, torch.Tensor]:
    """The state dict of a saved Hugging Face model directory: safetensors (single or sharded), or
    pytorch_model.bin read with `weights_only=True` so a pickle cannot run code."""
    from safetensors.torch import load_file

    directory = Path(directory)
    single, index, pickled = directory / WEIGHTS_FILE, directory / WEIGHTS_INDEX_FILE, directory / PICKLE_WEIGHTS_FILE
    try:
        if single.is_file():
            return load_file(single)
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(directory / shard))
            return state
        if pickled.is_file():
            return quiet_torch_load(pickled)
    except UserError:
        raise
    except Exception as exc:  # safetensors and torch.load raise many kinds on a damaged file
        raise UserError(f"{directory}: could not read the weights ({read_failure(exc)})") from None
    raise UserError(f"{directory}: no {WEIGHTS_FILE}, {WEIGHTS_INDEX_FILE} or {PICKLE_WEIGHTS_FILE} here")


def import_hf_dir(path: Path | str) -> GPT:
    """Load a directory written by `save_pretrained` of a GPT-2, GPT-NeoX or Llama model (the
    architectures export_hf writes) into a scratchlm GPT."""
    directory = Path(path)
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory; pass a local Hugging Face model directory")
    try:
        hf_config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{directory}: no config.json here; is this a Hugging Face model directory?") from None
    except ValueError as exc:
        raise UserError(f"{config_path}: not valid JSON ({exc})") from None
    if not isinstance(hf_config, dict) or "model_type" not in hf_config:
        hint = " (it looks like a scratchlm checkpoint, which needs no import)" if isinstance(hf_config, dict) and "model" in hf_config else ""
        raise UserError(f"model_type: {config_path} names none, so it is not a Hugging Face model config{hint}")
    from scratchlm.hf import hf_rotary

    kind = hf_config["model_type"]
    if kind in hf_rotary.IMPORTABLE:
        config = hf_rotary.config_from_hf(hf_config)
        convert = functools.partial(hf_rotary.state_dict_from_hf, arch=kind)
    else:
        config, convert = gpt_config_from_hf(hf_config), _state_dict_from_hf
    return _import_checked(config, str(config_path), lambda: read_hf_weights(directory), convert)


def import_hf_tokenizer(path: Path | str) -> Any:
    """The tokenizer of a Hugging Face model directory as a scratchlm tokenizer, or None.

    Three forms are recognised: GPT-2's own byte-level BPE (vocab.json + merges.txt or a
    tokenizer.json, 50257 ids, merges in id order, so tiktoken's rank-based BPE gives the same
    ids) becomes a `gpt2` tokenizer; a tokenizer.json holding scratchlm's <|bos|> and
    <|endoftext|> becomes a `bpe` tokenizer (a BPE model) or a `char` one (the WordLevel model
    export_hf writes for characters, its ids kept exactly as the file gives them; one that
    transformers would encode differently is a UserError). Anything else returns None: the model
    still imports, without a tokenizer.
    """
    from scratchlm.text.tokenizer import BOS, EOS, BPETokenizer

    directory = Path(path)
    tok_json, vocab_json, merges_txt = directory / "tokenizer.json", directory / "vocab.json", directory / "merges.txt"
    vocab: dict[str, int] | None = None
    merges: list[str] | None = None
    try:
        if tok_json.is_file():
            spec = json.loads(tok_json.read_text(encoding="utf-8"))
            added = {t["content"] for t in spec.get("added_tokens", [])}
            if {BOS, EOS} <= added and spec.get("model", {}).get("type") == "BPE":
                return BPETokenizer.from_file(tok_json)
            if {BOS, EOS} <= added and spec.get("model", {}).get("type") == "WordLevel":  # export_hf's char form
                from scratchlm.text.hf_char_tokenizer import char_tokenizer_from_hf

                return char_tokenizer_from_hf(spec, directory)
            vocab = spec.get("model", {}).get("vocab")
            merges = spec.get("model", {}).get("merges")
        elif vocab_json.is_file() and merges_txt.is_file():
            vocab = json.loads(vocab_json.read_text(encoding="utf-8"))
            merges = [m for m in merges_txt.read_text(encoding="utf-8").splitlines() if m and not m.startswith("#version")]
    except ValueError as exc:
        raise UserError(f"{directory}: unreadable tokenizer files ({exc})") from None
    if not isinstance(vocab, dict) or merges is None:
        return None
    return _gpt2_tokenizer_from_vocab(vocab, merges)


def _gpt2_tokenizer_from_vocab(vocab: dict[str, int], merges: list) -> Any:
    from scratchlm.text.tokenizer import EOS, GPT2_EOT_ID, GPT2_PATTERN, GPT2Tokenizer, byte_alphabet

    if len(vocab) != GPT2_EOT_ID + 1 or vocab.get(EOS) != GPT2_EOT_ID or len(merges) != GPT2_EOT_ID - 256:
        return None
    char_byte = {c: b for b, c in byte_alphabet().items()}
    ranks: dict[bytes, int] = {}
    for token, i in vocab.items():
        if token == EOS:
            continue
        if any(c not in char_byte for c in token):
            return None  # not a byte-level vocabulary
        ranks[bytes(char_byte[c] for c in token)] = i
    # tiktoken merges by rank (= id); that is HF's merge order only if merge k made id 256 + k
    for k, merge in enumerate(merges):
        a, b = merge.split(" ") if isinstance(merge, str) else merge
        if vocab.get(a + b) != 256 + k:
            return None
    import tiktoken

    enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOS: GPT2_EOT_ID})
    return GPT2Tokenizer(enc)


# --------------------------------------------------------------------------------------------
# Export: scratchlm -> Hugging Face
# --------------------------------------------------------------------------------------------


def hf_config_from_gpt(config: GPTConfig, *, bos_id: int | None = None, eos_id: int | None = None) -> dict[str, Any]:
    """The config.json of the GPT-2 that computes what `config` computes; UserError if none does."""
    refusals = [
        ("final_norm", not config.final_norm, "GPT-2 normalises before its head (ln_f); train with --final_norm"),
        ("pos_embedding", config.pos_embedding == "rope", "GPT-2 adds position vectors; it cannot rotate Q and K"),
        ("norm", config.norm != "layernorm", "GPT-2 uses LayerNorm with gamma and beta"),
        ("activation", config.activation not in ACTIVATIONS_TO_HF, "GPT-2's MLP has no gated (swiglu) form"),
        ("norm_position", config.norm_position != "pre", "GPT-2 blocks are pre-norm"),
    ]
    for field, refused, why in refusals:
        if refused:
            raise UserError(f"{field}: {getattr(config, field)!r} cannot be exported as GPT-2 ({why})")
    GPT2.check(config)  # a value none of the lines above knows
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,  # what llama.cpp's convert_hf_to_gguf.py reads as the context
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": config.n_inner,
        "activation_function": ACTIVATIONS_TO_HF[config.activation],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": config.tie_weights,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "dtype": "float32",
    }


def position_table(model: GPT) -> torch.Tensor:
    """The (block_size, n_embd) table a GPT-2 adds to the token embeddings for what `model` adds:
    its learned table, the fixed sinusoidal one (a learned table that happens to hold these
    values), or zeros for `none` (on CPU, in the embeddings' dtype)."""
    cfg, dtype = model.config, model.transformer.wte.weight.dtype
    if cfg.pos_embedding == "learned":
        return model.transformer.wpe.weight.detach().to("cpu")
    if cfg.pos_embedding == "sinusoidal":
        return model.pos_table.detach().to("cpu", dtype)
    if cfg.pos_embedding == "none":
        return torch.zeros(cfg.block_size, cfg.n_embd, dtype=dtype)
    raise UserError(f"pos_embedding {cfg.pos_embedding!r} has no table of position vectors to add")


def hf_state_dict_from_gpt(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under GPT2LMHeadModel's names and layouts (new contiguous tensors, on CPU)."""
    cfg = model.config
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    from scratchlm.hf.hf_rotary import drop_zero_head_bias

    drop_zero_head_bias(state, "GPT-2")
    if cfg.tie_weights:
        state.pop("lm_head.weight")  # GPT-2 rebuilds the tie from wte (tie_word_embeddings)
    if cfg.pos_embedding != "learned":
        state["transformer.wpe.weight"] = position_table(model)
    C, hidden = cfg.n_embd, cfg.mlp_hidden
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key.endswith(CONV1D_SUFFIXES):
            tensor = tensor.t()  # Linear (out, in) -> Conv1D (in, out)
        out[key] = tensor.contiguous().clone()
    zeros = lambda n: torch.zeros(n, dtype=out["transformer.wte.weight"].dtype)  # noqa: E731
    for i in range(cfg.n_layer):
        # a switched-off bias is a bias of zeros: the same function in GPT-2's fixed layout
        for name, width in (("attn.c_attn", 3 * C), ("attn.c_proj", C), ("mlp.c_fc", hidden), ("mlp.c_proj", C)):
            out.setdefault(f"transformer.h.{i}.{name}.bias", zeros(width))
    return out


def _generation_config(config: GPTConfig, bos_id: int | None, eos_id: int | None) -> dict[str, Any]:
    """generation_config.json: transformers' defaults for `generate` and `pipeline`. Without it
    their default length (20 new tokens past any prompt) runs past a small model's context;
    max_length caps prompt plus continuation at the context, and eos doubles as the pad id."""
    return {"max_length": config.block_size, "bos_token_id": bos_id, "eos_token_id": eos_id,
            "pad_token_id": eos_id, "do_sample": False}


def export_hf(model: GPT, out_dir: Path | str, tokenizer: Any = None) -> Path:
    """Write `model` (and `tokenizer`, if given) as a Hugging Face directory that
    `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` loads offline: GPT-2 for added
    positions, GPT-NeoX or Llama for RoPE (scratchlm.hf.hf_rotary.architecture says which, or why
    none fits).

    Writes config.json, generation_config.json and model.safetensors, plus tokenizer files for
    `char`, `bpe` and `gpt2` tokenizers (tokenizer.json and tokenizer_config.json, and
    vocab.json/merges.txt for gpt2). The directory appears complete or not at all (written beside
    it, then renamed); an existing non-empty out_dir is refused.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"{out_dir} already exists and is not empty; choose a new directory")
    check_folder_path(out_dir, "OUT_DIR")
    # besides the model: the exported tensors (transposed copies) and safetensors' bytes of them
    check_fits(footprint(model.config, param_bytes=8), "cpu", f"exporting a model of "
               f"{count_params(model.config)['total']:,} parameters", "the memory other programs hold (or export on "
               "a machine with more)")
    from scratchlm.hf import hf_rotary

    bos_id = getattr(tokenizer, "bos_id", None)
    eos_id = getattr(tokenizer, "eos_id", None)
    arch = hf_rotary.architecture(model.config)
    if arch == "gpt2":
        hf_config = hf_config_from_gpt(model.config, bos_id=bos_id, eos_id=eos_id)
        state = hf_state_dict_from_gpt(model)
    else:
        hf_config = hf_rotary.hf_config(model.config, arch, bos_id=bos_id, eos_id=eos_id)
        state = hf_rotary.hf_state_dict(model, arch)
    hf_config["dtype"] = str(model.transformer.wte.weight.dtype).removeprefix("torch.")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # a folder another writer filled since the check is refused when the staged one is renamed, left whole
    with staged_dir(out_dir, replace=False) as tmp:
        from safetensors.torch import save_file

        # transformers refuses safetensors files without format=pt metadata
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
        (tmp / "generation_config.json").write_text(json.dumps(_generation_config(model.config, bos_id, eos_id),
                                                               indent=2) + "\n", encoding="utf-8")
        if tokenizer is not None:
            write_hf_tokenizer(tokenizer, tmp, model_max_length=model.config.block_size)
    return out_dir


# --------------------------------------------------------------------------------------------
# Tokenizer files for AutoTokenizer
# --------------------------------------------------------------------------------------------


def write_hf_tokenizer(tokenizer: Any, directory: Path, *, model_max_length: int) -> bool:
    """Write files `transformers.AutoTokenizer` loads (char, bpe and gpt2 tokenizers); False, with
    a warning, for a kind that has no Hugging Face form."""
    from scratchlm.text.tokenizer import GPT2_EOT_ID

    kind = getattr(tokenizer, "kind", None)
    with tempfile.TemporaryDirectory() as saved:
        tokenizer.save(saved)  # the tokenizer's own public format, read back below
        saved = Path(saved)
        if kind == "bpe":
            from tokenizers import Tokenizer

            hf_tok = Tokenizer.from_file(str(saved / "tokenizer.json"))
        elif kind == "gpt2":
            hf_tok, vocab, merges = gpt2_tokenizer_from_ranks(saved / "gpt2.tiktoken")
            added = [t for t, i in tokenizer.specials.items() if i > GPT2_EOT_ID]  # in id order: 50257, ...
            hf_tok.add_special_tokens(added)
            (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
            merges_text = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
            (directory / "merges.txt").write_text(merges_text, encoding="utf-8")
        elif kind == "char":
            from scratchlm.text.hf_char_tokenizer import char_tokenizer_for_hf

            hf_tok = char_tokenizer_for_hf(tokenizer)
        else:
            warnings.warn(f"a {kind} tokenizer has no Hugging Face form; exported the model without tokenizer files")
            return False
    hf_tok.save(str(directory / "tokenizer.json"))
    id_to_token = {i: hf_tok.id_to_token(i) for i in (tokenizer.bos_id, tokenizer.eos_id)}
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": id_to_token[tokenizer.bos_id],
        "eos_token": id_to_token[tokenizer.eos_id],
        "pad_token": id_to_token[tokenizer.eos_id],  # batched pipelines need one; padding is masked out anyway
        "unk_token": None,
        "model_max_length": model_max_length,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        # scratchlm encodes user text literally ("<|endoftext|>" typed in stays characters);
        # this keeps transformers from turning such text into the special id
        "split_special_tokens": True,
    }
    if has_chat_tokens(tokenizer):
        # a fine-tuned run's template; its special spellings are read as their ids, as every
        # Hugging Face chat model reads its own (so `apply_chat_template` gives scratchlm's ids)
        tok_config |= {"chat_template": jinja_template(), "split_special_tokens": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
    return True


def gpt2_tokenizer_from_ranks(rank_file: Path):
    """GPT-2's vocab.json and merges from tiktoken's rank file, and the `tokenizers` BPE built on them.

    tiktoken stores only (token bytes, rank); a BPE vocabulary also needs the merge that made each
    token. Running byte-pair merging on a token's own bytes with only lower-ranked tokens allowed
    stops at exactly the two pieces whose merge produced it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from scratchlm.text.tokenizer import byte_alphabet

    ranks: dict[bytes, int] = {}
    for line in rank_file.read_text(encoding="ascii").splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    byte_char = byte_alphabet()
    spell = lambda b: "".join(byte_char[x] for x in b)  # noqa: E731
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best = min(
                range(len(parts) - 1),
                key=lambda i: ranks.get(parts[i] + parts[i + 1], float("inf")),
            )
            if ranks.get(parts[best] + parts[best + 1], float("inf")) >= rank:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) != 2:
            raise UserError(f"{rank_file}: token of rank {rank} cannot be split into a merge; not a BPE rank file")
        merges.append((spell(parts[0]), spell(parts[1])))
    vocab = {spell(token): rank for token, rank in ranks.items()}
    vocab["<|endoftext|>"] = len(ranks)
    bpe = models.BPE(vocab=vocab, merges=merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok, vocab, merges
