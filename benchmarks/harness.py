"""`python -m benchmarks`: run every benchmark, save the figures, and regenerate the results page.

    python -m benchmarks                    # prepare, decoding, training, the playground in a browser
                                            # (about 12-17 minutes)
    python -m benchmarks --time-to-loss     # ... and time to loss beside the classic recipe, natively and
                                            # as a CPU without bfloat16 units (about 25 minutes)
    python -m benchmarks --only train-gpu   # gpt2-124m on a CUDA GPU (bf16, compile, flash attention);
                                            # every run includes it, and it skips itself without CUDA
    python -m benchmarks --quick            # a short smoke run of everything (saved as ...-quick)
    python -m benchmarks --only decode      # some benchmarks; merged into today's file
    python -m benchmarks --only gguf        # batch-1 greedy decoding beside llama.cpp (llama-cpp-python) on
                                            # one trained model exported as GGUF, f32 and q8_0 (about a
                                            # minute; skips itself without llama-cpp-python)
    python -m benchmarks --only prepare-stream  # prepare on a generated 1 GB corpus (.txt and .jsonl),
                                            # beside tiktoken's batch encoder (minutes; --quick: 30 MB)
    python -m benchmarks --only tang        # the tang-poems preset's verse beside the classic recipe's
                                            # and the corpus's (3 seeds, about 20 minutes; needs the corpus)
                                            # (decode: torch's threads; decode-1t: one thread;
                                            # serve: needs Chromium and playwright, else skips)
    python -m benchmarks --only lora-memory # peak RSS of LoRA sft beside full sft, gpt2-124m's shape and
                                            # vocabulary (about a minute; needs GPT-2's rank file)
    python -m benchmarks --only tang-chat   # tang-chat's replies in the requested form beside the base's
                                            # (trains both presets; about ten minutes; needs the corpus)
    python -m benchmarks --page-only        # just regenerate docs/results.md from the newest file
                                            # (--readme-only is the old name of the same)

Figures go to benchmarks/results/<date>-<host>.json with a markdown table beside it (<...>.md);
a later run on the same day and host replaces the benchmarks it ran and keeps the others. The
section of docs/results.md between the `numbers:start` / `numbers:end` markers is regenerated
from the newest full (not --quick) results file; the README links to that page and holds no
figures of its own (its three headline figures are copied from it by hand). Every benchmark times its own peers in the same run and
repeats, reporting the best and the median; the machine (CPU, cores, threads, torch, load
average) is recorded with each benchmark, since these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"  # the results page the README links to
START, END = "<!-- numbers:start -->", "<!-- numbers:end -->"
PAGE_TITLE = "# Benchmark results\n\nWritten by `python -m benchmarks` (benchmarks/harness.py).\n"
BENCHMARKS = ("prepare", "prepare-stream", "decode-1t", "decode", "gguf", "train", "train-gpu", "serve", "tang", "tang-nobf16", "time_to_loss",
              "time_to_loss-nobf16", "lora-memory", "tang-chat")


# --------------------------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the figures depend on, recorded at the start of the run."""
    import torch

    from scratchlm.machine.cpu import cpu_name

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    try:
        import transformers

        hf = transformers.__version__
    except ImportError:
        hf = None
    from scratchlm.cli import doctor

    return {
        "doctor": doctor.facts(measure=True),  # what `scratchlm doctor` prints: flags, bf16, kernels, probes
        "host": socket.gethostname(), "cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": hf, "threads": torch.get_num_threads(),
        "default_dtype": str(torch.get_default_dtype()).replace("torch.", ""),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": list(os.getloadavg()), "commit": commit,
    }


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def _bench_prepare(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_prepare

    return bench_prepare.run(repeats=1 if quick else repeats)


PREPARE_STREAM_MB = 1000  # the size: about 1 GB of text, written as .txt and as .jsonl


def _bench_prepare_stream(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_prepare_stream  # skips itself without the offline GPT-2 rank file

    # Three pairs of each, back to back in alternating order: over the minutes a gigabyte takes, this
    # shared machine's speed drifts by tens of percent, so only pairs measured together compare.
    return bench_prepare_stream.run(size_mb=30 if quick else PREPARE_STREAM_MB, repeats=3)


def _bench_decode(quick: bool, repeats: int, threads: int | None = None) -> dict[str, Any]:
    from benchmarks import bench_decode

    if quick:
        return bench_decode.run(shapes=("smoke",), repeats=1, quick=True, threads=threads)
    return bench_decode.run(repeats=repeats, threads=threads)


def _bench_decode_one_thread(quick: bool, repeats: int) -> dict[str, Any]:
    # Batch-1 decoding on one thread as well: on a shared 2-core machine, two threads per
    # process contend with every other job, and their figures swing several-fold.
    return _bench_decode(quick, repeats, threads=1)


def _bench_gguf(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_gguf  # skips itself without llama-cpp-python

    # a decode here takes a fraction of a second: at least 10 runs each for a median worth having
    return bench_gguf.run(repeats=2 if quick else max(repeats, 10))


def _bench_train(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_train

    return bench_train.run(repeats=2 if quick else max(repeats, 3), quick=quick)


def _bench_train_gpu(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_train_gpu  # skips itself (quickly) where there is no CUDA device

    return bench_train_gpu.run(steps=5 if quick else 10, blocks=2 if quick else max(repeats, 3))


def _bench_serve(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_serve  # skips itself without playwright or a Chromium

    return bench_serve.run(repeats=1 if quick else repeats)


TIME_TO_LOSS_THREADS: int | None = None  # --ttl-threads


def _bench_tang(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_tang  # skips itself without the corpus (npm offline, no SCRATCHLM_TANG_SOURCE)

    return bench_tang.run(bench_tang.SEEDS[:1] if quick else bench_tang.SEEDS)


def _bench_tang_no_bf16(quick: bool, repeats: int) -> dict[str, Any]:
    """One seed of it as a CPU without bfloat16 units runs it (the preset's dtype auto is then
    float32), in a fresh process held below AVX512-BF16 from the start (NO_BF16_ENV)."""
    import tempfile

    from benchmarks.bench_time_to_loss import NO_BF16_ENV

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tang.json"
        subprocess.run([sys.executable, "-m", "benchmarks.bench_tang", "--seeds", "1", "--json", str(out)],
                       env={**os.environ, **NO_BF16_ENV}, cwd=ROOT, check=True)
        return json.loads(out.read_text(encoding="utf-8"))


def _bench_time_to_loss(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_time_to_loss

    return bench_time_to_loss.run(repeats=1 if quick else repeats, threads=TIME_TO_LOSS_THREADS)


def _bench_time_to_loss_no_bf16(quick: bool, repeats: int) -> dict[str, Any]:
    """The same, as a CPU without bfloat16 units runs it: in a fresh process whose oneDNN is held
    below AVX512-BF16 from the start (bench_time_to_loss.NO_BF16_ENV)."""
    import tempfile

    from benchmarks.bench_time_to_loss import NO_BF16_ENV

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ttl.json"
        command = [sys.executable, "-m", "benchmarks.bench_time_to_loss", "--repeats", str(1 if quick else repeats),
                   "--json", str(out)]
        if TIME_TO_LOSS_THREADS:
            command += ["--threads", str(TIME_TO_LOSS_THREADS)]
        subprocess.run(command, env={**os.environ, **NO_BF16_ENV}, cwd=ROOT, check=True)
        return json.loads(out.read_text())


def _bench_tang_chat(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_tang_chat  # skips itself without the corpus

    return bench_tang_chat.run(50 if quick else bench_tang_chat.REQUESTS)


def _bench_lora_memory(quick: bool, repeats: int) -> dict[str, Any]:
    from benchmarks import bench_lora  # skips itself without GPT-2's rank file

    return bench_lora.run()


RUNNERS: dict[str, Callable[[bool, int], dict[str, Any]]] = {
    "prepare": _bench_prepare, "prepare-stream": _bench_prepare_stream, "decode-1t": _bench_decode_one_thread, "decode": _bench_decode, "gguf": _bench_gguf, "train": _bench_train, "train-gpu": _bench_train_gpu,
    "serve": _bench_serve, "tang": _bench_tang, "tang-nobf16": _bench_tang_no_bf16, "time_to_loss": _bench_time_to_loss, "time_to_loss-nobf16": _bench_time_to_loss_no_bf16,
    "lora-memory": _bench_lora_memory, "tang-chat": _bench_tang_chat,
}


def run_benchmarks(names: list[str], quick: bool, repeats: int,
                   after_each: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """{name: figures} for each benchmark; a failing one records its error and the rest still run.
    after_each(figures so far) is called after every benchmark (to save them as they come)."""
    import torch

    out: dict[str, Any] = {}
    for name in names:
        print(f"== {name} (load average {os.getloadavg()[0]:.1f}) ==", flush=True)
        start = time.perf_counter()
        threads = torch.get_num_threads()
        entry: dict[str, Any] = {"started": dt.datetime.now().isoformat(timespec="seconds"),
                                 "load_average_start": list(os.getloadavg()), "threads": threads}
        try:
            entry["result"] = RUNNERS[name](quick, repeats)
        except Exception as exc:  # one broken benchmark must not lose the others' figures
            entry["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        finally:
            torch.set_num_threads(threads)
        entry["seconds"] = time.perf_counter() - start
        entry["load_average_end"] = list(os.getloadavg())
        out[name] = entry
        for row in rows_for(name, entry):
            print("  " + " | ".join(str(c) for c in row))
        if after_each is not None:
            after_each(out)
    return out


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _num(x: Any, digits: int = 1) -> str:
    if x is None or x == "":
        return ""
    if isinstance(x, (int, float)):
        return f"{x:,.{digits}f}"
    return str(x)


def rows_for(name: str, entry: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Table rows (benchmark, what, best, median, unit) for one benchmark's figures."""
    if "error" in entry:
        return [(name, f"failed: {entry['error']}", "", "", "")]
    r = entry.get("result", {})
    rows: list[tuple[str, str, str, str, str]] = []
    if name == "prepare":
        rows.append(("prepare", f"`{r['command']}`, end to end", _num(r["min_s"], 2), _num(r["median_s"], 2), "s"))
        rows.append(("prepare", "text throughput, end to end", "", _num(r["median_mb_per_s"], 2), "MB/s"))
    elif name == "prepare-stream":
        rows += _prepare_stream_rows(r)
    elif name in ("tang", "tang-nobf16"):
        rows += _tang_rows(r, name.endswith("nobf16"))
    elif name == "gguf":
        rows += _gguf_rows(r)
    elif name.startswith("decode"):
        if r.get("bf16_kernel"):
            rows.append((f"decode, {r.get('threads', '?')} thr", f"bf16 gemv kernel: {r['bf16_kernel'].split(':')[0]}",
                         "", "", ""))
        for shape, s in r.get("shapes", {}).items():
            where = f"decode {shape}, {r.get('threads', '?')} thr"
            for dec, d in s["decoders"].items():
                rows.append((where, dec, _num(d["best_tok_s"]), _num(d["median_tok_s"]), "tok/s"))
            bw = s["bandwidth"]
            for label, lim in s["limits"].items():
                mb = lim["bytes_per_token"] / 1e6
                reads = lim.get("paired_read_gb_s")
                if not reads:  # results from before the paired probes
                    rows.append((where, f"{label} limit: {bw['read_gb_s']:.1f} GB/s read / {mb:.0f} MB per token "
                                        f"(ours at {100 * lim['fraction']:.0f}%)", "", _num(lim["limit_tok_s"]), "tok/s"))
                    continue
                rows.append((where, f"{label} limit beside each run: {min(reads):.1f}-{max(reads):.1f} GB/s read / "
                                    f"{mb:.0f} MB per token (ours at {100 * lim['fraction']:.0f}%, median of runs)",
                             "", _num(lim["limit_tok_s"]), "tok/s"))
                rows.append((where, f"{label} strict limit: {bw['read_gb_s']:.1f} GB/s, the run's best read / "
                                    f"{mb:.0f} MB per token (ours at {100 * lim['strict_fraction']:.0f}%)",
                             "", _num(lim["strict_limit_tok_s"]), "tok/s"))
    elif name == "train":
        shape = r.get("shape", {})
        where = f"train step B {shape.get('B', '?')} T {shape.get('T', '?')} V {shape.get('V', '?')}"
        for mode, s in r.get("speed", {}).items():
            rows.append((where, mode, _num(s["best_tok_s"], 0), _num(s["median_tok_s"], 0), "tok/s"))
        for mode, m in r.get("memory", {}).items():
            rows.append(("train peak memory", mode, "", _num(m["growth_mb"], 0), "MB"))
        for mode, m in r.get("mfu", {}).items():
            # not the training log's MFU (a bound, scratchlm.machine.cpu.peak_flops_bound): a share of the best
            # matmul burst measured beside the steps, which a quiet moment can make look high
            rows.append(("train share of measured matmul peak", f"{mode} (of {m['peak_gflops']:.0f} GFLOP/s measured)",
                         _num(100 * m["mfu"]), _num(100 * m.get("mfu_median", m["mfu"])), "%"))
    elif name == "lora-memory":
        if "skipped" in r:
            return [("lora memory", f"skipped: {r['skipped']}", "", "", "")]
        where = f"sft of {r['model']}, {r['steps']} steps of batch {r['batch']}, peak RSS"
        for mode, m in r["modes"].items():
            rows.append((where, mode + (f" (rank {r['rank']})" if mode == "lora" else ""), "", _num(m["peak_rss_mb"], 0), "MB"))
        rows.append((where, f"lora / full (goal <= {r['goal']})", "", _num(r["ratio"], 2), "x"))
    elif name == "tang-chat":
        if "skipped" in r:
            return [("tang chat", f"skipped: {r['skipped']}", "", "", "")]
        for model, rates in r["rates"].items():
            for setting in ("greedy", "sampled"):
                for kind, rate in rates[setting].items():
                    rows.append((f"{model} replies in the requested form ({r['requests_per_kind']} held-out "
                                 f"requests a kind)", f"{kind}, {setting}", "", _num(100 * rate), "%"))
        for name_, t in r.get("trained", {}).items():
            rows.append((f"{name_} training", f"{t['steps']} steps in {t['dtype']}", "", _num(t["train_s"], 0), "s"))
    elif name == "train-gpu":
        if "skipped" in r:
            rows.append(("train gpu", f"skipped: {r['skipped']}", "", "", ""))
        for model, m in r.get("models", {}).items():
            where = f"train {r['device']} {r['shape']} B {r['batch']} T {r['block_size']}"
            rows.append((where, model, _num(m["best_tok_s"], 0), _num(m["median_tok_s"], 0), "tok/s"))
            if m.get("mfu") is not None:
                peak = m["peak_flops"]
                kind = "bound" if r["device"] == "cpu" else "datasheet"  # a CPU's: cores x clock x FLOP/cycle
                peak_text = f"{peak / 1e12:.0f} TFLOP/s" if peak >= 1e12 else f"{peak / 1e9:.0f} GFLOP/s"
                rows.append((where, f"{model} MFU (of {peak_text} {kind} bf16)", "", _num(100 * m["mfu"]), "%"))
            if m.get("peak_memory_mb") is not None:
                rows.append((where, f"{model} peak allocated memory", "", _num(m["peak_memory_mb"], 0), "MB"))
    elif name == "serve":
        if "skipped" in r:
            rows.append(("playground", f"skipped: {r['skipped']}", "", "", ""))
        for who, label in (("generate", "`scratchlm generate`'s loop"), ("browser", "tokens seen by the browser (Chromium)"),
                           ("http", "the same stream read by a plain HTTP client")):
            if who in r:
                rows.append((f"playground, greedy {r['new_tokens']} tokens, {r['model']}", label,
                             _num(r[who]["best_tok_s"], 0), _num(r[who]["median_tok_s"], 0), "tok/s"))
        alike = r.get("generate_server_threads")
        if alike:
            n = alike["threads"]
            rows.append((f"playground, greedy {r['new_tokens']} tokens, {r['model']}",
                         f"`scratchlm generate`'s loop at the server's {n} thread{'' if n == 1 else 's'} "
                         f"(the browser at {alike['browser_ratio']:.2f}x of it, median of pairs)",
                         _num(alike["best_tok_s"], 0), _num(alike["median_tok_s"], 0), "tok/s"))
    elif name.startswith("time_to_loss"):
        where = f"time to val loss 1.88, {r.get('threads', '?')} thr" + (", no bf16" if name.endswith("nobf16") else "")
        if "skipped" in r:
            rows.append((where, f"skipped: {r['skipped']}", "", "", ""))
        who = ([("classic recipe, HF GPT-2 (peer)", r["peer"])] if "peer" in r else []) + list(r.get("presets", {}).items())
        for label, s in who:
            losses = ", ".join(f"{x.get('val_loss', x.get('final_val_loss')):.3f}" for x in s["runs"])
            steps = ", ".join(str(x.get("reached_step") or "-") for x in s["runs"])
            text = label if label.startswith("classic") else f"`{label}`"
            rows.append((where, f"{text}: at steps {steps}, val {losses}{'' if s['reached'] else ' (not reached)'}",
                         _num(s["min_s"]), _num(s["median_s"]), "s"))
            rows.append((where, f"{text} tokens/s", "", _num(s["median_tokens_per_s"], 0), "tok/s"))
    return rows


def _prepare_stream_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """prepare on a generated corpus (.txt, .jsonl) beside tiktoken's batch encoder, same threads."""
    if "skipped" in r:
        return [("prepare-stream", f"skipped: {r['skipped']}", "", "", "")]
    rows = []
    for kind, f in r.get("files", {}).items():
        where = f"prepare {f['input_mb']:,.0f} MB .{kind}, gpt2, {r['workers']} thr"
        peer = f["tiktoken"]
        rows += [
            (where, "`scratchlm prepare`, end to end", _num(f["min_s"], 2), _num(f["median_s"], 2), "s"),
            (where, "`scratchlm prepare` text throughput, end to end", _num(f["best_mb_per_s"], 2),
             _num(f["median_mb_per_s"], 2), "MB/s"),
            (where, f"tiktoken encode_ordinary_batch (peer), encoding only (prepare at {f['ratio']:.2f}x)",
             _num(peer["best_mb_per_s"], 2), _num(peer["median_mb_per_s"], 2), "MB/s"),
            (where, "`scratchlm prepare` peak memory (RSS)", "", _num(f["peak_rss_mb"], 0), "MB"),
        ]
    return rows


def _gguf_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """scratchlm's batch-1 greedy decoding beside llama.cpp's on the same model, f32 and q8_0 files."""
    if "skipped" in r:
        return [("gguf", f"skipped: {r['skipped']}", "", "", "")]
    m = r["model"]
    where = (f"decode beside llama.cpp, {m['params'] / 1e6:.1f}M {m['arch']}, context {m['context']}: prompt "
             f"{r['prompt_tokens']} + {r['new_tokens']} new tokens, {r['threads']} thr")
    rows = []
    for name, d in r["decoders"].items():
        label = ("scratchlm Engine, KV cache, fp32" if name == "scratchlm"
                 else f"{name} (llama-cpp-python {r['llama_cpp']}, peer)")
        if name in r["agreement"]:
            label += f", same greedy ids: {'yes' if r['agreement'][name]['same_ids'] else 'no'}"
        rows.append((where, label, _num(d["best_tok_s"], 0), _num(d["median_tok_s"], 0), "tok/s"))
    for name, ratio in r["ratios"].items():
        rows.append((where, f"{name} (medians)", "", _num(ratio, 2), "x"))
    return rows


def _tang_rows(r: dict[str, Any], no_bf16: bool = False) -> list[tuple[str, str, str, str, str]]:
    """The tang-poems preset beside the classic recipe for the same time and the corpus itself:
    medians over the seeds (best = the best seed)."""
    if "skipped" in r:
        return [("tang", f"skipped: {r['skipped']}", "", "", "")]
    seeds = f"{len(r['seeds'])} seed{'s' if len(r['seeds']) > 1 else ''}" + (", no bf16" if no_bf16 else "")
    where = f"Tang poems, {seeds}, {r['samples']} samples of {r['tokens']} from {r['prompt']}"
    ours, classic, corpus = r["tang_poems"], r["classic"], r["corpus"]
    best = lambda runs, key, f=max: f(x[key] for x in runs)  # noqa: E731
    med = r["summary"]
    rows = [(where, "`tang-poems` training time", _num(best(ours, "train_s", min), 1), _num(med["tang_poems"]["train_s"], 1), "s")]
    for label, key in (("validation loss", "val_loss"), ("verse lines in form", "form_rate"), ("quatrains that rhyme", "rhyme_rate")):
        scale, unit = (1, "") if key == "val_loss" else (100, "%")
        f = min if key == "val_loss" else max
        rows.append((where, f"`tang-poems` {label}", _num(scale * best(ours, key, f), 2 if key == "val_loss" else 1),
                     _num(scale * med["tang_poems"][key], 2 if key == "val_loss" else 1), unit))
        rows.append((where, f"classic recipe, same time: {label}", _num(scale * best(classic, key, f), 2 if key == "val_loss" else 1),
                     _num(scale * med["classic"][key], 2 if key == "val_loss" else 1), unit))
        if key != "val_loss":
            rows.append((where, f"the corpus itself: {label}", "", _num(scale * corpus[key], 1), unit))
    return rows


def _target_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, entry in results.get("benchmarks", {}).items():
        for t in entry.get("result", {}).get("targets", []):
            lower = t.get("lower_is_better") or "memory" in t["target"]
            label = t["target"] + (" (no bf16)" if name.endswith("nobf16") else "")  # the same targets, run twice
            rows.append((label, _num(t["ratio"], 2), f"{'<=' if lower else '>='} {t['goal']}",
                         "met" if t["met"] else "**not met**"))
    return rows


def _provenance(results: dict[str, Any]) -> str:
    """Which command (at which commit) produced the figures now in the file, benchmark by
    benchmark: a file merged from several runs says where each part came from."""
    by = results.get("produced_by")
    if not by:  # a file from before produced_by was kept: all that is known is the last command
        return f"Command: `{results['command']}`."
    groups: dict[tuple[str, str], list[str]] = {}
    for name in results["benchmarks"]:
        source = by.get(name, {"command": None, "commit": None})
        groups.setdefault((source["command"], source["commit"]), []).append(name)
    if len(groups) == 1 and None not in next(iter(groups)):
        ((command, _),) = groups
        return f"Command: `{command}`."
    return "Figures from several runs merged into one file: " + "; ".join(
        f"{', '.join(names)} by " + (f"`{command}` at commit {commit}" if command else "an earlier run, not recorded")
        for (command, commit), names in groups.items()) + "."


def markdown(results: dict[str, Any]) -> str:
    """The results as markdown: the machine, one table of figures, one table of targets."""
    m = results["machine"]
    load = ", ".join(f"{x:.1f}" for x in m["load_average"])
    lines = [
        f"Measured {results['date']} on `{m['host']}`: {m['cpu']}, {m['cores']} cores, torch {m['torch']}"
        + (f", transformers {m['transformers']}" if m.get("transformers") else "")
        + f", {m['threads']} torch threads, default dtype {m['default_dtype']}"
        + (f", GPU {m['cuda']}" if m.get("cuda") else "")
        + f"; load average {load} when the last run started (commit {m.get('commit') or '?'}). "
        + _provenance(results),
        "",
        "| benchmark | what | best | median | unit |",
        "|---|---|---:|---:|---|",
    ]
    for name, entry in results["benchmarks"].items():
        for row in rows_for(name, entry):
            lines.append("| " + " | ".join(row) + " |")
    loads = [f"{name} {entry['load_average_start'][0]:.1f}" for name, entry in results["benchmarks"].items()]
    lines += ["", "Load average (1 min) when each benchmark started: " + ", ".join(loads) + ". "
              "Best = fastest run; ratios below use medians.", ""]
    targets = _target_rows(results)
    if targets:
        lines += ["| target | measured | goal | |", "|---|---:|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in targets]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Files and the results page
# --------------------------------------------------------------------------------------------


def results_path(date: str, host: str, quick: bool, folder: Path | None = None) -> Path:
    return (folder or RESULTS) / f"{date}-{host}{'-quick' if quick else ''}.json"


def newest_results(folder: Path | None = None, include_quick: bool = False) -> Path | None:
    """The most recently written results file (full runs only, unless include_quick)."""
    files = [p for p in (folder or RESULTS).glob("*.json") if include_quick or not p.stem.endswith("-quick")]
    return max(files, key=lambda p: (json.loads(p.read_text()).get("finished", ""), p.name), default=None)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def update_page(section: str, page: Path | None = None, source: Path | None = None) -> None:
    """Replace what lies between the markers of the results page with `section`, under a line
    that links the results file it came from; a page without the markers gets them at its end,
    and a missing page is started with a title."""
    page = page or PAGE
    text = page.read_text(encoding="utf-8") if page.exists() else PAGE_TITLE
    note = ""
    if source is not None:
        link = Path(os.path.relpath(source, page.parent)).as_posix()
        name = _shown(source) if source.is_relative_to(ROOT) else source.name
        note = (f"Generated by `python -m benchmarks` from [{name}]({link}); "
                "edits between the markers are overwritten.\n\n")
    block = f"{START}\n{note}{section.rstrip()}\n{END}"
    if START in text and END in text and text.index(START) < text.index(END):
        new = text[: text.index(START)] + block + text[text.index(END) + len(END):]
    else:
        new = text.rstrip() + "\n\n" + block + "\n"
    if new != text or not page.exists():
        page.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(page, new)


def regenerate_page(folder: Path | None = None, page: Path | None = None) -> Path | None:
    """Write the newest full results file (else the newest quick one) into the results page;
    the file used, or None (and the page untouched) when there is none."""
    path = newest_results(folder) or newest_results(folder, include_quick=True)
    if path is None:
        return None
    update_page(markdown(json.loads(path.read_text())), page, source=path.resolve())
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (saved as <date>-<host>-quick)")
    parser.add_argument("--time-to-loss", action="store_true", help="also time training to loss 1.88 (minutes)")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, help="run only these benchmarks")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per benchmark (default: 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--ttl-threads", type=int, default=None,
                        help="threads for the time-to-loss trainings (default: --threads, else torch's choice)")
    parser.add_argument("--page-only", "--readme-only", dest="page_only", action="store_true",
                        help=f"only regenerate {_shown(PAGE)} from the newest results")
    parser.add_argument("--no-page", "--no-readme", dest="no_page", action="store_true",
                        help=f"leave {_shown(PAGE)} alone")
    args = parser.parse_args(argv)

    if args.page_only:
        path = regenerate_page()
        print(f"{_shown(PAGE)}: figures from {path}" if path else f"no results in {RESULTS}")
        return 0 if path else 1
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    global TIME_TO_LOSS_THREADS
    TIME_TO_LOSS_THREADS = args.ttl_threads or args.threads
    names = list(args.only) if args.only else [n for n in BENCHMARKS if not n.startswith("time_to_loss") or args.time_to_loss]
    date = dt.date.today().isoformat()
    info = machine()
    path = results_path(date, info["host"], args.quick)
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"benchmarks": {}}
    command = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv)
    results.update(date=date, machine=info, command=command)
    results.pop("commands", None)  # the history of an older file; produced_by says what counts
    earlier = dict(results["benchmarks"])

    def save(done: dict[str, Any]) -> None:  # after every benchmark, so a cut-short run keeps its figures
        merged = {**earlier, **done}
        produced = results.setdefault("produced_by", {})
        produced.update({n: {"command": command, "commit": info.get("commit") or "?"} for n in done})
        results["benchmarks"] = {n: merged[n] for n in BENCHMARKS if n in merged}
        results["finished"] = dt.datetime.now().isoformat(timespec="seconds")
        RESULTS.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, json.dumps(results, indent=1, default=str) + "\n")
        _write_atomic(path.with_suffix(".md"), markdown(results))

    run_benchmarks(names, args.quick, args.repeats, after_each=save)
    print(f"\nwrote {path} and {path.with_suffix('.md').name}")
    print(markdown(results))
    if not args.no_page:
        print(f"{_shown(PAGE)}: figures from {regenerate_page()}")
    return 0
