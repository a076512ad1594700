"""Training speed and memory: our training step beside Hugging Face's GPT-2, in one run.

Three measurements, each against a peer measured in the same run (shared machines are noisy, so
only ratios carry over between runs):

1. Tokens/s of a full training step (forward, backward, gradient clipping to 1.0, AdamW step,
   zero_grad) at the `smoke` shape: batch 8 x 256 tokens, vocabulary 50304, 2 layers, 4 heads,
   width 128. Ours runs through the trainer's own step function (scratchlm.training.train.train_step)
   in several modes; Hugging Face's `GPT2LMHeadModel` (fp32, random weights, the same sizes, its
   default attention implementation) runs with `torch.optim.AdamW`'s defaults, at torch's
   thread count and at 1 thread; our fastest mode is judged against the faster of the two. All
   modes are timed interleaved, after warm-up steps, and reported as min and median.
2. Peak memory of that step: resident-set growth (VmHWM) over two training steps, each model in a
   fresh subprocess that has already imported torch and transformers and built the model.
   CPU only (Linux /proc); a CUDA variant would read torch.cuda.max_memory_allocated instead.
3. The share of a measured matmul peak (an MFU against the best matmul FLOP/s measured in this
   run for the same precision, not the training log's MFU, which divides by a bound) at a
   compute-bound shape (C 512, 8 layers, 8 heads, T 512, V 8192, batch 8).

    python -m benchmarks.bench_train                # everything (about 2-4 minutes on 2 cores)
    python -m benchmarks.bench_train --quick        # fewer repeats, no torch.compile row
    python -m benchmarks.bench_train --json out.json

`run(repeats=..., quick=...)` returns the figures as a dict for other code. Never run as a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import torch

from scratchlm.machine import cpu
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

B, T = 8, 256  # the smoke shape's batch
MFU_MODEL = dict(n_embd=512, n_layer=8, n_head=8, block_size=512, vocab_size=8192)
MFU_BATCH = 8

# Our modes: (dtype, fused_loss, compile, threads). "fp32" is the trainer's default (fused loss
# on). threads None: torch's default; 1 spares a busy machine OpenMP's spin-waiting: with other
# processes on both cores, each parallel op waits for a descheduled partner thread (measured on
# the shakespeare-char model under load 5: 2 threads 440-550 ms/step, 1 thread 70 ms/step,
# 2 threads with OMP_WAIT_POLICY=passive 130 ms/step).
OUR_MODES: dict[str, tuple[str, bool, bool, int | None]] = {
    "ours fp32 plain-loss": ("float32", False, False, None),
    "ours fp32": ("float32", True, False, None),
    "ours bf16": ("bfloat16", True, False, None),
    "ours bf16 1 thread": ("bfloat16", True, False, 1),
    "ours bf16 compiled": ("bfloat16", True, True, None),
}
HF = "hf fp32"
HF_1T = "hf fp32 1 thread"  # Hugging Face with the same thread lever as our 1-thread mode
HF_BEST = "hf best"  # the faster of the two HF rows (by median), the bar for our fastest mode

TARGETS = (
    # (label, numerator, denominator, goal, higher is better)
    ("fastest mode tokens/s vs best HF", "fastest", HF_BEST, 2.0, True),
    ("fp32 eager tokens/s vs HF", "ours fp32", HF, 1.2, True),
    ("peak memory (fastest) vs HF", "fastest", HF, 0.6, False),
    ("peak memory (ours fp32) vs HF", "ours fp32", HF, 0.6, False),
)


# --------------------------------------------------------------------------------------------
# Models and steps
# --------------------------------------------------------------------------------------------


def our_model(**overrides: Any) -> GPT:
    """The smoke model as a CPU run trains it: the training copy attached (scratchlm.training.parts)."""
    from scratchlm.kernels.training_copy import attach_training_kernels

    torch.manual_seed(0)
    return attach_training_kernels(GPT(GPTConfig.from_name("smoke", **overrides)).train())


def hf_model(vocab: int = 50304, n_layer: int = 2, n_head: int = 4, n_embd: int = 128, n_positions: int = 256):
    """GPT-2 as Hugging Face builds it (tied head, GELU, biases), random weights, default attention."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # a harmless note about loss_type on every forward
    torch.manual_seed(0)
    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions, vocab_size=vocab)
    return GPT2LMHeadModel(config).train()


class _SameBatch:
    """The trainer's batch stream, reduced to one fixed batch (data loading is not timed)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


def batch(vocab: int, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (b, t + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # (b, t) each


def our_step(mode: str, overrides: dict | None = None, b: int = B) -> tuple[Callable[[], None], GPT]:
    """One call = one optimizer step of the trainer's own step function, in `mode`."""
    from scratchlm.training.distributed import Dist
    from scratchlm.training.train import TrainConfig, TrainParts, make_optimizer, train_step

    dtype, fused, compiled, threads = OUR_MODES[mode]
    model = our_model(**(overrides or {}))
    cfg = TrainConfig(model="smoke", batch_size=b, dtype=dtype, fused_loss=fused, compile=compiled, grad_clip=1.0)
    device = torch.device("cpu")
    optimizer = make_optimizer(model, cfg, device)
    forward = torch.compile(model) if compiled else model
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    stream = _SameBatch(*batch(model.config.vocab_size, b, model.config.block_size))
    parts = TrainParts(model=model, forward=forward, optimizer=optimizer, scaler=scaler, batches=stream)
    def step():
        default = torch.get_num_threads()
        torch.set_num_threads(threads or default)
        try:
            return train_step(parts, cfg, Dist(), device)
        finally:
            torch.set_num_threads(default)

    return step, model


def hf_step(b: int = B, threads: int | None = None, **sizes: int) -> tuple[Callable[[], None], Any]:
    """One Hugging Face training step: loss from labels (shifted inside), clip, AdamW, zero_grad."""
    hf = hf_model(**sizes)
    optimizer = torch.optim.AdamW(hf.parameters(), lr=3e-4, weight_decay=0.1)
    x, _ = batch(hf.config.vocab_size, b, hf.config.n_positions)

    def step() -> None:
        default = torch.get_num_threads()
        torch.set_num_threads(threads or default)
        try:
            loss = hf(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        finally:
            torch.set_num_threads(default)

    return step, hf


def time_interleaved(steps: dict[str, Callable[[], Any]], repeats: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per step of each, warmed up, then timed round-robin so load hits all alike."""
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


# --------------------------------------------------------------------------------------------
# Peak memory (a fresh process per model)
# --------------------------------------------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _memory_child(mode: str) -> None:
    """In a subprocess: build `mode`'s model, then report the resident-set peak of two steps."""
    import transformers  # noqa: F401  (imported before the baseline, as for every mode)

    step = hf_step()[0] if mode == HF else our_step(mode)[0]
    base = _status_kb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        source = "VmHWM"
    except OSError:
        source = "ru_maxrss"
    for _ in range(2):  # the first step also allocates gradients and AdamW's state
        step()
    if source == "VmHWM":
        peak = _status_kb("VmHWM")
    else:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mode": mode, "growth_mb": (peak - base) / 1024, "base_mb": base / 1024, "source": source}))


def peak_memory(mode: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.bench_train", "--memory-child", mode, "--threads",
           str(torch.get_num_threads())]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=root, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# MFU
# --------------------------------------------------------------------------------------------


def matmul_peak(dtype: torch.dtype) -> float:
    """Best FLOP/s of square matmuls of a few sizes: this machine's own ceiling for `dtype`
    (scratchlm.machine.cpu's probe, the one `scratchlm doctor` prints, over more sizes and bursts)."""
    return cpu.matmul_flops(dtype, sizes=(512, 1024, 2048), bursts=5, burst_s=0.05)


def mfu(mode: str, repeats: int) -> dict[str, Any]:
    from scratchlm.machine.flops import flops_per_token

    step, model = our_step(mode, MFU_MODEL, b=MFU_BATCH)
    dtype = torch.bfloat16 if OUR_MODES[mode][0] == "bfloat16" else torch.float32
    default = torch.get_num_threads()
    threads = OUR_MODES[mode][3] or default

    def probe() -> float:  # the peak with the step's own thread count
        torch.set_num_threads(threads)
        try:
            return matmul_peak(dtype)
        finally:
            torch.set_num_threads(default)

    peak = probe()
    times = time_interleaved({mode: step}, repeats, warmup=1)[mode]
    peak = max(peak, probe())  # probe again after the steps: the best moment counts
    tokens = MFU_BATCH * model.config.block_size
    flops = flops_per_token(model.config).training * tokens
    return {"mode": mode, "threads": threads, "peak_gflops": peak / 1e9, "step_min_s": min(times), "step_median_s": statistics.median(times),
            "achieved_gflops": flops / min(times) / 1e9, "mfu": flops / min(times) / peak,
            "mfu_median": flops / statistics.median(times) / peak}


# --------------------------------------------------------------------------------------------
# The whole benchmark
# --------------------------------------------------------------------------------------------


def _compiles() -> bool:
    try:
        import torch._dynamo  # noqa: F401

        return True
    except Exception:
        return False


def run(repeats: int = 5, quick: bool = False, memory: bool = True, mfu_repeats: int | None = None,
        compile: bool | None = None) -> dict[str, Any]:
    """All figures as a dict (see the module docstring); prints nothing."""
    import transformers

    result: dict[str, Any] = {
        "torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "load_before": os.getloadavg(), "shape": {"B": B, "T": T, "V": 50304},
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }
    compile = (not quick and _compiles()) if compile is None else compile
    modes = [m for m in OUR_MODES if compile or not OUR_MODES[m][2]]

    steps: dict[str, Callable[[], Any]] = {}
    startup: dict[str, float] = {}
    for mode in modes:
        start = time.perf_counter()
        steps[mode] = our_step(mode)[0]
        steps[mode]()  # the first step: where torch.compile does its work
        startup[mode] = time.perf_counter() - start
    hf_fn, hf = hf_step()
    steps[HF] = hf_fn
    steps[HF_1T] = hf_step(threads=1)[0]
    result["hf_attention"] = hf.config._attn_implementation
    times = time_interleaved(steps, repeats, warmup=1 if quick else 2)
    speed = {}
    for name, t in times.items():
        speed[name] = {"min_s": min(t), "median_s": statistics.median(t), "best_tok_s": B * T / min(t),
                       "median_tok_s": B * T / statistics.median(t), "first_step_s": startup.get(name)}
    result["speed"] = speed
    fastest = max((m for m in modes), key=lambda m: speed[m]["median_tok_s"])
    result["fastest"] = fastest

    if memory:
        mem_modes = sorted({"ours fp32", "ours fp32 plain-loss", fastest, HF}, key=list(speed).index)
        result["memory"] = {m: peak_memory(m) for m in mem_modes}

    mfu_modes = ("ours bf16", "ours fp32") if quick else ("ours bf16", "ours bf16 1 thread", "ours fp32")
    result["mfu"] = {m: mfu(m, mfu_repeats or (1 if quick else 2)) for m in mfu_modes}
    result["load_after"] = os.getloadavg()

    def figure(name: str, what: str) -> float:
        key = fastest if name == "fastest" else name
        if what == "memory":
            return result["memory"][key]["growth_mb"]
        if key == HF_BEST:
            return max(speed[HF]["median_tok_s"], speed[HF_1T]["median_tok_s"])
        return speed[key]["median_tok_s"]

    targets = []
    for label, num, den, goal, higher in TARGETS:
        if label.startswith("peak memory") and not memory:
            continue
        what = "memory" if label.startswith("peak memory") else "speed"
        ratio = figure(num, what) / figure(den, what)
        targets.append({"target": label, "ratio": ratio, "goal": goal, "met": ratio >= goal if higher else ratio <= goal})
    best_mfu = max(result["mfu"].values(), key=lambda r: r["mfu"])
    targets.append({"target": f"share of the measured matmul peak ({best_mfu['mode']})", "ratio": best_mfu["mfu"], "goal": 0.5,
                    "met": best_mfu["mfu"] >= 0.5})
    result["targets"] = targets
    return result


def print_report(r: dict[str, Any]) -> None:
    print(f"torch {r['torch']}, transformers {r['transformers']}, {r['threads']} threads of {r['cpus']} CPUs, "
          f"load average before {r['load_before'][0]:.1f}, after {r['load_after'][0]:.1f}, "
          f"OMP_WAIT_POLICY={r['omp_wait_policy'] or 'unset'}")
    print(f"\ntraining step at smoke shape (B {B}, T {T}, V 50304); HF attention: {r['hf_attention']}")
    print(f"  {'mode':<22}{'best tok/s':>11}{'median tok/s':>14}{'min s':>8}{'median s':>10}{'first step s':>14}")
    for name, s in r["speed"].items():
        first = f"{s['first_step_s']:.1f}" if s["first_step_s"] is not None else "-"
        print(f"  {name:<22}{s['best_tok_s']:>11.0f}{s['median_tok_s']:>14.0f}{s['min_s']:>8.3f}{s['median_s']:>10.3f}"
              f"{first:>14}")
    print(f"  fastest of ours: {r['fastest']}")
    if "memory" in r:
        print("\npeak memory of two training steps (resident-set growth, fresh process each)")
        for name, m in r["memory"].items():
            print(f"  {name:<22}{m['growth_mb']:>9.0f} MB   (model built: {m['base_mb']:.0f} MB, {m['source']})")
    print(f"\nMFU at C 512, 8 layers, T 512, V 8192, B {MFU_BATCH}")
    for name, m in r["mfu"].items():
        print(f"  {name:<22} {100 * m['mfu']:5.1f}% (median {100 * m['mfu_median']:.1f}%, {m['threads']} threads): "
              f"{m['achieved_gflops']:.0f} of {m['peak_gflops']:.0f} GFLOP/s measured matmul peak, "
              f"step {m['step_min_s']:.2f} s")
    print("\ntargets (speed ratios on median tokens/s)")
    for t in r["targets"]:
        sign = ">=" if "memory" not in t["target"] else "<="
        print(f"  {t['target']:<34} {t['ratio']:6.2f}  (goal {sign} {t['goal']})  {'met' if t['met'] else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per mode (default: 5)")
    parser.add_argument("--quick", action="store_true", help="fewer warm-up steps and MFU repeats, no compile row")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="time a torch.compile mode too (default: unless --quick)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        _memory_child(args.memory_child)
        return
    result = run(repeats=args.repeats, quick=args.quick, memory=not args.no_memory, compile=args.compile)
    print_report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
