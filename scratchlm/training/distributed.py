"""Several processes: torchrun's process group, and FSDP2's sharding and full state dicts.

PyTorch's own engine does the work (torch.distributed, DDP in scratchlm.training.train, FSDP2's
fully_shard here); this module only joins the group torchrun describes in its environment
variables and moves values and states between the processes. With one process every helper is
the identity, so the training loop reads the same either way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from scratchlm.machine.devices import pick_device
from scratchlm.model.gpt import GPT
from scratchlm.training.train_config import TrainConfig


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_processes(cfg: TrainConfig) -> tuple[Dist, torch.device]:
    """Join torchrun's process group when its environment variables are set; pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist_info = Dist(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    device = pick_device(cfg.device, allow_mps=world == 1)
    if device.type == "cuda" and world > 1:
        device = torch.device(f"cuda:{dist_info.local_rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return dist_info, device


def all_mean(value: torch.Tensor, d: Dist) -> torch.Tensor:
    """The average of a scalar tensor over all processes (itself when there is one)."""
    if not d.enabled:
        return value
    import torch.distributed as dist

    value = value.detach().clone().float()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / d.world_size


def all_max(value: float, d: Dist, device: torch.device) -> float:
    """The largest of a number over all processes (itself when there is one)."""
    if not d.enabled:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def any_rank(flag: bool, d: Dist, device: torch.device) -> bool:
    if not d.enabled:
        return flag
    import torch.distributed as dist

    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def gather_objects(obj: Any, d: Dist) -> list[Any]:
    if not d.enabled:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out



def apply_fsdp(model: GPT, device: torch.device, d: Dist) -> torch.nn.Module:
    """Shard every block, then the rest (embeddings, final norm, head), over all processes."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # The loop never modifies the model's outputs in place, which is what this warning is about.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh(device.type, (d.world_size,))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_states(raw_model: GPT, model, optimizer, cfg: TrainConfig, d: Dist) -> tuple[dict, dict]:
    """Unsharded model and optimizer state dicts (collective under FSDP; call on every rank)."""
    if cfg.fsdp and d.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        return model_state, optimizer_state
    return raw_model.state_dict(), optimizer.state_dict()


def fsdp_load_optimizer(model, optimizer, optimizer_state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optimizer_state["optimizer"],
                             options=StateDictOptions(full_state_dict=True))
