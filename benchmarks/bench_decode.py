"""Batch-1 decoding speed beside Hugging Face, and beside what this machine's memory allows.

A batch-1 decoding step reads every weight once (every Linear, lm_head included) to produce one
token, so its speed limit is memory bandwidth / bytes of weights per token. This benchmark
measures the bandwidth itself (the best of several passes summing a 256 MB float32 array, with
the thread count used for decoding), counts the bytes per token of each precision, and prints
the achieved rate beside that limit.

The bandwidth of these shared machines moves with their other tenants: within one run, 2-thread
probes read 24, 50 and 34 GB/s. So each timed run of ours is paired with probes just before and
just after it; the higher of the two sets that run's limit, and the share of the limit is the
median over runs. The strict share, against the highest bandwidth seen anywhere in the run
(before the first shape, after each, and beside every run), is reported beside it. The KV cache (a few MB here) is not counted: it is state,
not weights, so the limit is slightly optimistic and the fraction slightly pessimistic.

Decoders, 128 new tokens after a 16-token prompt, on the same random weights; greedy:

    ours fp32           Engine.generate_ids, use_cache=True: float32 weights (our decoding copy; prompt
                        and steps through the compiled decode_step.c where it builds)
    ours bf16           the same with dtype=torch.bfloat16: bfloat16 weights, float32 activations;
                        where scratchlm.kernels builds, the compiled decode_step.c takes the
                        prompt (16 rows: two calls of 8) and then up to 8 greedy steps per call
    ours bf16 oneDNN    the same copy with layout="packed": oneDNN's packed bfloat16 matmul through
                        the model's modules, the library path the kernels replace (attention still
                        through attend_one; not with --quick)
    ours fp32 no-cache  the plain loop of S20 (use_cache=False); one run, no warm-up, at gpt2-124m (slow)
    hf fp32             transformers GPT2LMHeadModel.generate(use_cache=True)
    hf bf16             the same model cast to bfloat16 (not with --quick)

and, not greedy, sampling at temperature 0.8 among the top 200 (what a user's generation does; the
ids differ, drawn from different random streams):

    ours bf16 sampled   Engine(dtype=torch.bfloat16).generate_ids(temperature=0.8, top_k=200), seeded
    hf fp32 sampled     generate(do_sample=True, temperature=0.8, top_k=200), torch.manual_seed first

Runs are interleaved (a busy machine slows all alike); each decoder runs once to warm up (its
time, "first s", includes building our decoding copy), then `repeats` times.

    python benchmarks/bench_decode.py                          # smoke and gpt2-124m, 3 repeats
    python benchmarks/bench_decode.py --shapes gpt2-124m --threads 1
    python benchmarks/bench_decode.py --shapes gpt2-124m --variant x86-64-v4   # what a CPU without AVX512-BF16 builds

The report names the kernel variant and loop it timed (scratchlm.kernels; `--variant` sets
SCRATCHLM_KERNEL_VARIANT, and `--no-native-bf16` sets SCRATCHLM_CPU_BF16=0 so the "native" build
is the one a CPU without bfloat16 units gets).

Never run as a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/bench_decode.py`

from benchmarks.bench_generate import NEW_TOKENS, PROMPT_LEN, build  # noqa: E402
from scratchlm.kernels.decoding_copy import Decoder  # noqa: E402
from scratchlm.generation.engine import Engine  # noqa: E402
from scratchlm.generation.settings import GenerationSettings  # noqa: E402
from scratchlm.kernels import cpu_kernels, kernel_status, selected_variant  # noqa: E402
from scratchlm.machine.cpu import copy_bandwidth, read_bandwidth  # noqa: E402
from scratchlm.model.gpt import GPT  # noqa: E402

TARGET_SHAPE = "gpt2-124m"
TARGET_VS_HF = 2.0
TARGET_OF_LIMIT = 0.7


SAMPLING = {"temperature": 0.8, "top_k": 200}  # the sampled decoders' settings
PAIRED = {"ours fp32": "fp32", "ours bf16": "bf16"}  # our decoders whose runs get a bandwidth probe each


def memory_bandwidth(megabytes: int = 256, passes: int = 5, copy: bool = True) -> dict[str, float]:
    """GB/s read by torch.sum over a float32 array far larger than the caches, with the current
    thread count, the best of `passes` (scratchlm.machine.cpu's probes, which `scratchlm doctor`
    prints). copy: also a copy into a second array (read + write)."""
    out = {"read_gb_s": read_bandwidth(megabytes, passes), "array_mb": megabytes}
    if copy:
        out["copy_gb_s"] = copy_bandwidth(megabytes, passes)
    return out


def limits(per_token: int, achieved_tok_s: float, paired: list[dict[str, float]], best_read_gb_s: float) -> dict[str, Any]:
    """Our rate beside the bandwidth limit, for `per_token` bytes of weights per token.

    paired: one {"tok_s", "read_gb_s"} per timed run, the bandwidth probed beside that run; each
    run's share is its rate over its own limit, and the share reported is their median. The strict
    share compares the median rate with the run's best bandwidth (best_read_gb_s)."""
    strict_limit = best_read_gb_s * 1e9 / per_token
    shares = [r["tok_s"] / (r["read_gb_s"] * 1e9 / per_token) for r in paired]
    return {
        "bytes_per_token": per_token, "ours_median_tok_s": achieved_tok_s,
        "paired_read_gb_s": [r["read_gb_s"] for r in paired],
        "limit_tok_s": statistics.median(r["read_gb_s"] * 1e9 / per_token for r in paired) if paired else strict_limit,
        "fraction": statistics.median(shares) if shares else achieved_tok_s / strict_limit,
        "strict_limit_tok_s": strict_limit, "strict_fraction": achieved_tok_s / strict_limit,
    }


def weight_bytes_per_token(model: GPT, weight_dtype: torch.dtype) -> int:
    """Bytes of parameters one batch-1 step reads: every Linear's weight and bias in `weight_dtype`
    (lm_head in full, also when tied to the embedding), one row of each embedding table, and the
    norms' parameters in the model's own dtype."""
    size = torch.empty(0, dtype=weight_dtype).element_size()
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            total += module.weight.numel() * size + (module.bias.numel() * size if module.bias is not None else 0)
        elif isinstance(module, nn.Embedding):
            total += module.embedding_dim * module.weight.element_size()
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            total += sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    return total


def _decoders(model: GPT, hf, prompt: torch.Tensor, quick: bool) -> dict[str, Any]:
    mask = torch.ones_like(prompt)
    hf.generation_config.eos_token_id = None  # never stop early: always NEW_TOKENS tokens
    hf.generation_config.pad_token_id = 0
    hf_bf16 = None
    if not quick:
        import copy

        hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16)

    greedy = GenerationSettings.of(max_new_tokens=NEW_TOKENS, greedy=True)

    def ours(dtype=None, use_cache=True):
        engine = Engine(model, dtype=dtype, use_cache=use_cache)
        return lambda: engine.generate_ids(prompt, greedy)

    def theirs(m, **sampling):
        def call():
            if sampling:
                torch.manual_seed(0)
            with torch.inference_mode():
                return m.generate(prompt, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  do_sample=bool(sampling), use_cache=True, num_beams=1, **sampling)
        return call

    def ours_packed():
        packed = {}

        def call():
            if not packed:  # built inside the warm-up run, as generate_ids builds its own copies
                packed["engine"] = Engine(Decoder.build(model, torch.bfloat16, layout="packed"))
            return packed["engine"].generate_ids(prompt, greedy)
        return call

    runs = {"ours fp32": ours(), "ours bf16": ours(torch.bfloat16), "ours fp32 no-cache": ours(use_cache=False),
            "hf fp32": theirs(hf)}
    sampled = GenerationSettings.of(max_new_tokens=NEW_TOKENS, seed=0, **SAMPLING)
    runs["ours bf16 sampled"] = lambda: Engine(model, dtype=torch.bfloat16).generate_ids(prompt, sampled)
    runs["hf fp32 sampled"] = theirs(hf, **SAMPLING)
    if hf_bf16 is not None:
        runs["hf bf16"] = theirs(hf_bf16)
        if torch.backends.mkldnn.is_available():
            runs["ours bf16 oneDNN"] = ours_packed()
    return runs


def bench_shape(shape: str, repeats: int, quick: bool = False) -> dict[str, Any]:
    model, hf, prompt = build(shape, "cpu")
    runs = _decoders(model, hf, prompt, quick)
    big = model.num_params() > 50e6
    times: dict[str, list[float]] = {name: [] for name in runs}
    paired: dict[str, list[dict[str, float]]] = {}  # precision label -> [{tok_s, read_gb_s}] per timed run
    first: dict[str, float] = {}
    outputs = {}
    for name, fn in runs.items():  # warm-up (and our decoding copies are built here)
        if name.endswith("no-cache") and big:
            continue  # its one timed run follows the fp32 warm-up, which built the copy it uses
        start = time.perf_counter()
        outputs[name] = fn()
        first[name] = time.perf_counter() - start
    for r in range(repeats):
        for name, fn in runs.items():
            if name.endswith("no-cache") and big and r > 0:
                continue  # about 10x slower than the rest: one timed run is plenty
            probe = name in PAIRED
            before = memory_bandwidth(passes=3, copy=False)["read_gb_s"] if probe else None
            start = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - start)
            outputs.setdefault(name, out)
            if probe:
                after = memory_bandwidth(passes=3, copy=False)["read_gb_s"]
                paired.setdefault(PAIRED[name], []).append(
                    {"tok_s": NEW_TOKENS / times[name][-1], "read_gb_s": max(before, after)})
    bandwidth = memory_bandwidth()
    decoders = {}
    for name, t in times.items():
        decoders[name] = {"min_s": min(t), "median_s": statistics.median(t), "runs": len(t), "first_s": first.get(name),
                          "best_tok_s": NEW_TOKENS / min(t), "median_tok_s": NEW_TOKENS / statistics.median(t)}
    bytes_per_token = {label: weight_bytes_per_token(model, dtype)
                       for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    reference = outputs["hf fp32"]
    return {
        "shape": shape, "params": model.num_params(), "prompt": PROMPT_LEN, "new_tokens": NEW_TOKENS,
        "decoders": decoders, "bandwidth_after": bandwidth, "bytes_per_token": bytes_per_token, "paired": paired,
        "same_ids_as_hf_fp32": {n: bool(torch.equal(o, reference)) for n, o in outputs.items() if "sampled" not in n},
        "ratios": {
            "ours bf16 / hf fp32": decoders["ours bf16"]["median_tok_s"] / decoders["hf fp32"]["median_tok_s"],
            "ours fp32 / hf fp32": decoders["ours fp32"]["median_tok_s"] / decoders["hf fp32"]["median_tok_s"],
            "ours bf16 sampled / hf fp32 sampled":
                decoders["ours bf16 sampled"]["median_tok_s"] / decoders["hf fp32 sampled"]["median_tok_s"],
            "ours bf16 sampled / ours bf16": decoders["ours bf16 sampled"]["median_tok_s"] / decoders["ours bf16"]["median_tok_s"],
            "ours fp32 / ours fp32 no-cache":
                decoders["ours fp32"]["median_tok_s"] / decoders["ours fp32 no-cache"]["median_tok_s"],
            **({"ours bf16 / hf bf16": decoders["ours bf16"]["median_tok_s"] / decoders["hf bf16"]["median_tok_s"]}
               if "hf bf16" in decoders else {}),
            **({"ours bf16 / ours bf16 oneDNN":
                decoders["ours bf16"]["median_tok_s"] / decoders["ours bf16 oneDNN"]["median_tok_s"]}
               if "ours bf16 oneDNN" in decoders else {}),
        },
    }


def run(shapes: tuple[str, ...] = ("smoke", TARGET_SHAPE), repeats: int = 3, quick: bool = False,
        threads: int | None = None) -> dict[str, Any]:
    """All figures as a dict; prints nothing. `threads` sets torch's CPU threads for the run."""
    import transformers

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        result: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                                  "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                                  "bf16_kernel": kernel_status(), "kernel_variant": selected_variant(),
                                  "kernel_loop": getattr(cpu_kernels(), "loop", None), "load_before": os.getloadavg()}
        first = memory_bandwidth()
        result["shapes"] = {shape: bench_shape(shape, repeats, quick) for shape in shapes}
        result["load_after"] = os.getloadavg()
        # The limit uses the best bandwidth seen in the whole run (before, and after each shape):
        # a pass slowed by other jobs must not lower the bar.
        reads = [first["read_gb_s"]] + [s["bandwidth_after"]["read_gb_s"] for s in result["shapes"].values()]
        reads += [r["read_gb_s"] for s in result["shapes"].values() for runs in s["paired"].values() for r in runs]
        copies = [first["copy_gb_s"]] + [s["bandwidth_after"]["copy_gb_s"] for s in result["shapes"].values()]
        for s in result["shapes"].values():
            s["bandwidth"] = {"read_gb_s": max(reads), "copy_gb_s": max(copies), "all_reads_gb_s": reads}
            s["limits"] = {label: limits(per_token, s["decoders"][f"ours {label}"]["median_tok_s"],
                                         s["paired"].get(label, []), max(reads))
                           for label, per_token in s["bytes_per_token"].items()}
    finally:
        torch.set_num_threads(before)
    targets = []
    if TARGET_SHAPE in result["shapes"]:
        s = result["shapes"][TARGET_SHAPE]
        ratio = s["ratios"]["ours bf16 / hf fp32"]
        targets.append({"target": f"decode {TARGET_SHAPE} ours bf16 / hf fp32 ({result['threads']} thr)",
                        "ratio": ratio, "goal": TARGET_VS_HF, "met": ratio >= TARGET_VS_HF})
        frac = s["limits"]["bf16"]["fraction"]
        targets.append({"target": f"decode {TARGET_SHAPE} bf16 share of bandwidth limit ({result['threads']} thr)",
                        "ratio": frac, "goal": TARGET_OF_LIMIT, "met": frac >= TARGET_OF_LIMIT})
    result["targets"] = targets
    return result


def print_report(r: dict[str, Any]) -> None:
    print(f"torch {r['torch']}, transformers {r['transformers']}, {r['threads']} threads of {r['cpus']} CPUs, "
          f"load average before {r['load_before'][0]:.1f}, after {r['load_after'][0]:.1f}")
    print(f"decoding kernels timed: {r.get('bf16_kernel', '-')}")
    for shape, s in r["shapes"].items():
        print(f"\n{shape}: {s['params'] / 1e6:.1f}M parameters, batch 1, prompt {s['prompt']}, "
              f"{s['new_tokens']} new tokens, greedy")
        print(f"  {'decoder':<20}{'best tok/s':>11}{'median tok/s':>14}{'runs':>6}{'first s':>9}")
        for name, d in s["decoders"].items():
            first = f"{d['first_s']:.2f}" if d["first_s"] is not None else "-"
            print(f"  {name:<20}{d['best_tok_s']:>11.1f}{d['median_tok_s']:>14.1f}{d['runs']:>6}{first:>9}")
        bw = s["bandwidth"]
        print(f"  memory bandwidth (best of the run): read {bw['read_gb_s']:.1f} GB/s, copy {bw['copy_gb_s']:.1f} GB/s "
              f"(reads measured: {', '.join(f'{x:.1f}' for x in bw['all_reads_gb_s'])})")
        for label, lim in s["limits"].items():
            print(f"  {label} weights: {lim['bytes_per_token'] / 1e6:.1f} MB per token; bandwidth beside each run "
                  f"{', '.join(f'{x:.1f}' for x in lim['paired_read_gb_s'])} GB/s -> median limit "
                  f"{lim['limit_tok_s']:.1f} tok/s; ours at {100 * lim['fraction']:.0f}% of it (median of runs); "
                  f"strict: {100 * lim['strict_fraction']:.0f}% of {lim['strict_limit_tok_s']:.1f} tok/s")
        for name, ratio in s["ratios"].items():
            print(f"  {name}: {ratio:.2f}x (median)")
        print("  same ids as hf fp32: " + ", ".join(f"{n}={v}" for n, v in s["same_ids_as_hf_fp32"].items()))
    if r["targets"]:
        print("\ntargets")
        for t in r["targets"]:
            print(f"  {t['target']:<58} {t['ratio']:6.2f}  (goal >= {t['goal']})  {'met' if t['met'] else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["smoke", TARGET_SHAPE], help="model presets to time")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per decoder (default: 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="skip the hf bf16 decoder")
    parser.add_argument("--variant", default=None, help="kernel variant to build and time (SCRATCHLM_KERNEL_VARIANT: "
                        "native, x86-64-v4, x86-64-v3, x86-64-v2, scalar)")
    parser.add_argument("--no-native-bf16", action="store_true",
                        help="time this CPU as one without bfloat16 units (SCRATCHLM_CPU_BF16=0)")
    args = parser.parse_args()
    if args.variant:  # read when the kernels are first loaded, which is after this
        os.environ["SCRATCHLM_KERNEL_VARIANT"] = args.variant
    if args.no_native_bf16:
        os.environ["SCRATCHLM_CPU_BF16"] = "0"
    print_report(run(tuple(args.shapes), args.repeats, args.quick, args.threads))


if __name__ == "__main__":
    main()
