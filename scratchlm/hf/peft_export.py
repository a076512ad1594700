"""A LoRA run exported as Hugging Face folders that `peft` puts together: OUT/base (the run's base,
with the new tokens' trained rows, as `export-hf` writes a model) and OUT/adapter
(adapter_config.json and adapter_model.safetensors), so that

    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("OUT/base"), "OUT/adapter")

computes what the merged export computes.

The export to transformers' layouts (scratchlm.hf.interop, scratchlm.hf.hf_rotary) only moves,
splits and transposes a matrix's rows and columns as wholes: GPT-2's Conv1D transposes, GPT-NeoX
interleaves each head's q, k and v rows, Llama splits c_attn into q/k/v and c_fc into gate/up.
What it does to the rows of W (d_out, d_in) it does to the rows of any matrix of d_out rows, so
each B (d_out, r) goes through that same export, written into the first r columns of W's place
(zeros after), and comes out as the B of each module that W became; A (r, d_in) reads the input,
which no layout changes, and goes to each of them as it is. No layout knowledge is restated here.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import torch

from scratchlm.errors import UserError, check_folder_path
from scratchlm.model.lora import LoRALinear, has_lora, merge_lora

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def export_peft(adapted, out_dir: Path | str, tokenizer: Any = None) -> Path:
    """Write OUT/base and OUT/adapter for `adapted` (a GPT with its LoRA layers unmerged)."""
    from scratchlm.hf.interop import export_hf

    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"{out_dir} already exists and is not empty; choose a new directory")
    check_folder_path(out_dir, "OUT_DIR")
    lora = {name: m for name, m in adapted.named_modules() if isinstance(m, LoRALinear)}
    if not lora:
        raise UserError("the checkpoint has no LoRA adapters to export apart; export-hf without --lora writes it whole")
    rank, alpha = next(iter(lora.values())).rank, next(iter(lora.values())).alpha
    base = _with_matrices(adapted, {name: m.base.weight for name, m in lora.items()})
    adapter, fan_in_fan_out = _adapter_tensors(adapted, base, lora, rank)
    staged = out_dir.parent / f".{out_dir.name}.partial"
    if staged.exists():
        raise UserError(f"{staged} is left from an export that stopped; remove it and export again")
    try:
        export_hf(base, staged / "base", tokenizer)
        (staged / "adapter").mkdir()
        from safetensors.torch import save_file

        save_file(adapter, str(staged / "adapter" / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
                  "bias": "none", "fan_in_fan_out": fan_in_fan_out, "inference_mode": True,
                  "target_modules": sorted({k[len("base_model.model."):-len(".lora_A.weight")]
                                            for k in adapter if k.endswith(".lora_A.weight")}),
                  "base_model_name_or_path": "../base"}
        (staged / "adapter" / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        if out_dir.exists():  # an empty folder the user made
            for part in staged.iterdir():
                part.rename(out_dir / part.name)
        else:
            staged.rename(out_dir)
    finally:
        if staged.exists():
            import shutil

            shutil.rmtree(staged, ignore_errors=True)
    return out_dir


def _adapter_tensors(adapted, base, lora: dict, rank: int) -> tuple[dict[str, torch.Tensor], bool]:
    """PEFT's tensors by name, and whether the modules are Conv1D (GPT-2: fan_in_fan_out)."""
    if any(rank > m.base.in_features for m in lora.values()):
        raise UserError(f"rank {rank} is above a matrix's input width; such adapters cannot be exported apart")
    zeroed = _with_matrices(base, {n: torch.zeros_like(m.base.weight) for n, m in lora.items()})
    zero = _hf_state(zeroed)  # every adapted matrix zero: a key that differs from it below comes from B
    out: dict[str, torch.Tensor] = {}
    conv1d = False
    for kind in sorted({n.split(".", 3)[3] for n in lora}):  # attn.c_attn, ...: one export per kind
        mine = {n: m for n, m in lora.items() if n.endswith("." + kind)}
        padded = {n: torch.nn.functional.pad(m.lora_B.detach(), (0, m.base.in_features - rank))
                  for n, m in mine.items()}  # (d_out, d_in): B, then zeros (peft applies alpha / r itself)
        for key, tensor in _hf_state(_with_matrices(zeroed, padded)).items():
            if torch.equal(tensor, zero[key]):
                continue
            layer = int(re.search(r"\.(\d+)\.", key).group(1))
            source = mine[f"transformer.h.{layer}.{kind}"]
            transposed = _is_conv1d(key)  # GPT-2's Conv1D holds (d_in, d_out): B's columns are its first rows
            conv1d |= transposed
            b = tensor[:rank].t() if transposed else tensor[:, :rank]  # (d_out_of_this_module, r)
            module = key[: -len(".weight")]
            out[f"base_model.model.{module}.lora_A.weight"] = source.lora_A.detach().clone().contiguous()
            out[f"base_model.model.{module}.lora_B.weight"] = b.contiguous().clone()
    return out, conv1d


def _is_conv1d(key: str) -> bool:
    from scratchlm.hf.interop import CONV1D_SUFFIXES

    return key.startswith("transformer.h.") and key.endswith(CONV1D_SUFFIXES)


def _with_matrices(model, weights: dict[str, torch.Tensor]):
    """A plain copy of `model` (merged if adapted) with the named matrices replaced."""
    plain = merge_lora(model) if has_lora(model) else copy.deepcopy(model)
    with torch.no_grad():
        for name, w in weights.items():
            plain.get_submodule(name).weight.copy_(w)
    return plain


def _hf_state(model) -> dict[str, torch.Tensor]:
    from scratchlm.hf import hf_rotary
    from scratchlm.hf.interop import hf_state_dict_from_gpt

    arch = hf_rotary.architecture(model.config)
    return hf_state_dict_from_gpt(model) if arch == "gpt2" else hf_rotary.hf_state_dict(model, arch)
