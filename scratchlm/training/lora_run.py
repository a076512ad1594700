"""A LoRA run (`--lora_rank R` with `--init_from`): the loop, checkpoints and resume of any run,
with three differences, all here:

    the model     the source's (its rows grown for new ids), every weight frozen, the adapters of
                  scratchlm.model.lora added; the optimizer sees only what requires a gradient
    the base      written once, when the run folder is made, as RUN/base: a weights-only
                  checkpoint of the model at step 0 (B = 0, so exactly the source with its new
                  rows), whose sha256 every checkpoint records
    checkpoints   only the adapters' tensors and the new rows (scratchlm.model.lora.trainable_state);
                  scratchlm.checkpoint.load_model
                  puts them on RUN/base, checked against that sha256, and merges them for
                  generation and export (or leaves them apart to resume)
"""

from __future__ import annotations

import torch

from scratchlm import checkpoint as ckpt_io
from scratchlm.fileio import file_record
from scratchlm.model.lora import add_lora, plain_state


def adapt(model: torch.nn.Module, cfg, added_ids: list[int]) -> torch.nn.Module:
    """The new run's model with its adapters (and the rows from the first added id trainable)."""
    return add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, new_rows_from=new_rows_from(added_ids))


def new_rows_from(added_ids: list[int]) -> int | None:
    """The first row a LoRA run trains in the (V, C) matrices: the first id the tokenizer gained."""
    return min(added_ids) if added_ids else None


def base_record(setup, model: torch.nn.Module) -> dict:
    """{"sha256": of RUN/base's weights}: a new run writes RUN/base from `model` at step 0 (the
    main process; call once the folder is the run's); a resumed one reads the record it saved."""
    if setup.resume_ckpt is not None:
        return dict(ckpt_io.SavedConfig.read(setup.resume_ckpt).extra.get("lora_base") or {})
    base = _Plain(model.config, plain_state(model, merged=False))  # the base's own tensors, not a copy of them
    out = ckpt_io.save_model_checkpoint(base, setup.tokenizer, setup.run_dir / ckpt_io.LORA_BASE_DIR,
                                        extra_config={"lora_base_of": str(setup.cfg.init_from)})
    added = setup.fine_tuning.added_ids if setup.fine_tuning is not None else []
    return {"sha256": file_record(out / ckpt_io.WEIGHTS_FILE)["sha256"], "from": str(setup.cfg.init_from),
            "new_rows_from": new_rows_from(added)}


class _Plain:
    """What save_model_checkpoint reads of a model (its config and state dict), for a state
    without a GPT built around it: a second model's memory is what LoRA saves."""

    def __init__(self, config, state: dict[str, torch.Tensor]):
        self.config, self._state = config, state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state
