"""Training speed on a CUDA GPU at GPT-2 small: bf16, torch.compile, flash attention, MFU.

The issue's GPU row: our training step at `gpt2-124m` (12 layers, width 768, context 1024,
vocabulary 50304) under bfloat16 autocast, compiled, with attention forced onto PyTorch's
FlashAttention kernel, beside Hugging Face's `GPT2LMHeadModel` of the same size in the same run
(bfloat16 autocast, its SDPA attention, compiled too, fused AdamW). Reported per model: tokens/s
(min and median of timed blocks of steps), peak allocated GPU memory, and MFU: training FLOPs per
token (scratchlm.machine.flops.flops_per_token: the count `scratchlm inspect` prints) x tokens/s over the
GPU's datasheet dense bf16 peak (scratchlm.machine.flops.device_peak; None for a GPU not in its table; on a
CPU, the bound from its cores, clock and FLOPs per cycle).

    python -m benchmarks.bench_train_gpu                       # needs CUDA; says so and stops otherwise
    python -m benchmarks.bench_train_gpu --batch 8 --steps 10  # a smaller or shorter run

On a machine without CUDA, `run()` returns {"skipped": reason}; `run(device="cpu", ...)` runs the
same code path on the CPU at whatever small shape it is given (the tests do that, so the path is
checked without a GPU). Never run as a test at full size.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/bench_train_gpu.py`

from benchmarks.bench_train import _SameBatch, batch  # noqa: E402  (the CPU benchmark's fixed batch)
from scratchlm.model.config import GPTConfig  # noqa: E402
from scratchlm.model.gpt import GPT  # noqa: E402

SHAPE = "gpt2-124m"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _attention_context(device: torch.device, flash: bool):
    """Force PyTorch's FlashAttention kernel for SDPA on CUDA (an error, not a silent fallback,
    if it cannot run); elsewhere SDPA's own choice."""
    if device.type == "cuda" and flash:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    return contextlib.nullcontext()


def _batch(vocab: int, b: int, t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """bench_train's fixed batch, moved to the device."""
    x, y = batch(vocab, b, t)
    return x.to(device), y.to(device)  # (b, t) each


def our_step(config: GPTConfig, b: int, device: torch.device, compile: bool) -> tuple[Callable[[], Any], GPT]:
    """One call = one optimizer step of the trainer's own step function (bf16 autocast, fused
    loss, gradient clipping, fused AdamW)."""
    from scratchlm.training.distributed import Dist
    from scratchlm.training.train import TrainConfig, TrainParts, make_optimizer, train_step

    torch.manual_seed(0)
    model = GPT(config).to(device).train()
    cfg = TrainConfig(model="gpt2-124m", batch_size=b, dtype="bfloat16", compile=compile, grad_clip=1.0)
    optimizer = make_optimizer(model, cfg, device)
    forward = torch.compile(model) if compile else model
    scaler = torch.amp.GradScaler(device.type, enabled=False)  # bf16 needs no loss scaling
    stream = _SameBatch(*_batch(config.vocab_size, b, config.block_size, device))
    parts = TrainParts(model=model, forward=forward, optimizer=optimizer, scaler=scaler, batches=stream)
    return lambda: train_step(parts, cfg, Dist(), device), model


def hf_step(config: GPTConfig, b: int, device: torch.device, compile: bool) -> tuple[Callable[[], Any], Any]:
    """One Hugging Face step at the same size: bf16 autocast, loss from labels, clip, fused AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    hf_config = GPT2Config(n_layer=config.n_layer, n_head=config.n_head, n_embd=config.n_embd,
                           n_positions=config.block_size, vocab_size=config.vocab_size)
    hf_config._attn_implementation = "sdpa"  # PyTorch's SDPA: FlashAttention on CUDA, as ours
    model = GPT2LMHeadModel(hf_config).to(device).train()
    forward = torch.compile(model) if compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                                  fused=device.type in ("cuda", "cpu"))
    x, _ = _batch(config.vocab_size, b, config.block_size, device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = forward(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def time_blocks(step: Callable[[], Any], device: torch.device, steps: int, blocks: int) -> list[float]:
    """Seconds per step of `blocks` timed blocks of `steps` steps each (the GPU runs ahead of
    Python, so single steps are not timed: a block ends with a synchronisation)."""
    out = []
    for _ in range(blocks):
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        out.append((time.perf_counter() - start) / steps)
    return out


def _measure(name: str, make: Callable, config: GPTConfig, b: int, device: torch.device, compile: bool,
             flash: bool, steps: int, blocks: int, warmup: int) -> dict[str, Any]:
    from scratchlm.machine.flops import device_peak, flops_per_token

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with _attention_context(device, flash):
        step, model = make(config, b, device, compile)
        start = time.perf_counter()
        for _ in range(warmup):  # compilation happens in the first one
            step()
        _sync(device)
        warmup_s = time.perf_counter() - start
        per_step = time_blocks(step, device, steps, blocks)
    tokens = b * config.block_size
    n_params = sum(p.numel() for p in model.parameters())  # a tied matrix once
    flops = flops_per_token(config).training
    peak, peak_source = device_peak(device, "bfloat16") or (None, None)
    median = statistics.median(per_step)
    return {
        "name": name, "params": n_params, "warmup_s": warmup_s, "step_min_s": min(per_step), "step_median_s": median,
        "best_tok_s": tokens / min(per_step), "median_tok_s": tokens / median,
        "peak_memory_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "peak_flops": peak, "peak_source": peak_source, "mfu": flops * tokens / median / peak if peak else None,
    }


def run(device: str = "cuda", shape: str = SHAPE, batch: int = 16, block_size: int | None = None,
        steps: int = 10, blocks: int = 3, warmup: int = 3, compile: bool = True, flash: bool = True,
        hf: bool = True, **model_overrides: Any) -> dict[str, Any]:
    """All figures as a dict; prints nothing. {"skipped": why} when `device` is CUDA and there is none."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        return {"skipped": "no CUDA device on this machine", "targets": []}
    overrides = dict(model_overrides)
    if block_size is not None:
        overrides["block_size"] = block_size
    config = GPTConfig.from_name(shape, **overrides)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
        "shape": shape, "batch": batch, "block_size": config.block_size, "vocab_size": config.vocab_size,
        "compile": compile, "flash_attention": flash and dev.type == "cuda", "dtype": "bfloat16",
        "load_before": os.getloadavg(),
    }
    models = {"ours bf16" + (" compiled" if compile else ""): our_step}
    if hf:
        models["hf bf16" + (" compiled" if compile else "")] = hf_step
    result["models"] = {name: _measure(name, make, config, batch, dev, compile, flash, steps, blocks, warmup)
                        for name, make in models.items()}
    names = list(result["models"])
    if len(names) == 2:
        ours, theirs = (result["models"][n] for n in names)
        result["ratio_tok_s"] = ours["median_tok_s"] / theirs["median_tok_s"]
    result["targets"] = []  # the issue asks for the figures here, not a goal
    return result


def print_report(r: dict[str, Any]) -> None:
    if "skipped" in r:
        print(f"skipped: {r['skipped']}")
        return
    print(f"{r['device']}, torch {r['torch']}: {r['shape']}, batch {r['batch']} x {r['block_size']} tokens, "
          f"{r['dtype']}, compile {r['compile']}, flash attention {r['flash_attention']}")
    for name, m in r["models"].items():
        mfu = f"{100 * m['mfu']:.1f}%" if m["mfu"] is not None else "-"
        mem = f"{m['peak_memory_mb']:,.0f} MB" if m["peak_memory_mb"] is not None else "-"
        print(f"  {name:<22} {m['median_tok_s']:>12,.0f} tok/s (best {m['best_tok_s']:,.0f})  MFU {mfu}  "
              f"peak memory {mem}  warm-up {m['warmup_s']:.1f} s")
    if "ratio_tok_s" in r:
        print(f"  ours / hf tokens/s: {r['ratio_tok_s']:.2f}x (median)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (default: 16)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block (default: 10)")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks (default: 3)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face peer")
    args = parser.parse_args()
    print_report(run(args.device, batch=args.batch, steps=args.steps, blocks=args.blocks,
                     compile=not args.no_compile, hf=not args.no_hf))


if __name__ == "__main__":
    main()
