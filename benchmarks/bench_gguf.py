"""Batch-1 greedy decoding beside llama.cpp, on the same trained model exported as GGUF.

One run trains the README's default shape in a temporary folder (TRAIN: the `shakespeare-char`
preset for 200 steps, about 15 s on 2 cores: 4 layers, width 128, context 64, RoPE, which llama.cpp
runs as GPT-NeoX; the char tokenizer), writes it with scratchlm.gguf.export.export_gguf in f32 and
in q8_0, and times greedy decoding of one fixed line of the corpus (PROMPT, encoded with the run's
tokenizer) up to the end of the context (64 - prompt tokens new), so every decoder stays inside
the window the model was trained on:

    scratchlm        Engine(model, use_cache=True).generate_ids, greedy, float32; choosing among
                     the tokenizer's ids, the ones the GGUF file holds
    llama.cpp f32    llama_cpp.Llama(f32 file, n_ctx=64, n_threads=T, verbose=False) (llama-cpp-python):
                     reset(), then generate(prompt ids, temp=0.0, repeat_penalty=1.0) for the new tokens
    llama.cpp q8_0   the same on the q8_0 file

All three use the same thread count T, torch's (`--threads`); llama.cpp's prompt threads
(n_threads_batch, else every core) too. Each runs once to warm up, then `repeats` times,
interleaved so that a busy machine slows all alike. A run's time is the whole call, prompt
included; tokens/s = new tokens / that time, best and median over the runs; the ratios are
scratchlm / llama.cpp of the medians. Whether llama.cpp's greedy ids equal scratchlm's is
recorded, not asserted: llama.cpp's gptneox graph computes GELU's tanh form (within 4.8e-4 of the
exact GELU the model uses), so a near tie between two tokens may go the other way; q8_0's weights
are rounded.

    python -m benchmarks --only gguf
    python benchmarks/bench_gguf.py --repeats 20 --threads 1

Needs llama-cpp-python (pip install llama-cpp-python); without it the benchmark is skipped, with
the reason, before anything is trained. Never run as a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python benchmarks/bench_gguf.py`

from scratchlm.generation.engine import Engine  # noqa: E402
from scratchlm.generation.settings import GenerationSettings  # noqa: E402

PROMPT = "THESEUS:\nNow, fair"  # how A Midsummer Night's Dream opens in the built-in corpus
TRAIN = ["train", "--preset", "shakespeare-char", "--max_steps", "200", "--eval_interval", "0",
         "--sample_tokens", "0", "--progress", "quiet"]
DTYPES = ("f32", "q8_0")
OURS = "scratchlm"


def _train(out_dir: Path) -> float:
    """`python -m scratchlm train ...TRAIN --out_dir out_dir` in a fresh process; its seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "scratchlm", *TRAIN, "--out_dir", str(out_dir)], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"training the model failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return time.perf_counter() - start


def _decoders(model: Any, files: dict[str, Path], prompt: list[int], new_tokens: int,
              vocab: int) -> dict[str, Callable[[], list[int]]]:
    """name -> a call that decodes `new_tokens` greedily after `prompt` and returns the new ids."""
    import llama_cpp

    threads = torch.get_num_threads()
    greedy = GenerationSettings.of(max_new_tokens=new_tokens, greedy=True)
    engine = Engine(model, use_cache=True, vocab=vocab)
    idx = torch.tensor([prompt])  # (1, T0)

    def ours() -> list[int]:
        return engine.generate_ids(idx, greedy)[0, len(prompt):].tolist()

    def theirs(path: Path) -> Callable[[], list[int]]:
        llm = llama_cpp.Llama(str(path), n_ctx=model.config.block_size, n_threads=threads,
                              n_threads_batch=threads, verbose=False)

        def call() -> list[int]:
            llm.reset()  # else generate reuses the cached prompt of the previous run
            out: list[int] = []
            for token in llm.generate(prompt, temp=0.0, repeat_penalty=1.0):
                out.append(token)
                if len(out) == new_tokens:
                    break
            return out
        return call

    return {OURS: ours, **{f"llama.cpp {dtype}": theirs(files[dtype]) for dtype in DTYPES}}


def _time(runs: dict[str, Callable[[], list[int]]], repeats: int) -> tuple[dict[str, list[int]], dict[str, list[float]]]:
    """Each decoder once to warm up (its ids kept), then `repeats` interleaved timed rounds."""
    from benchmarks.bench_train import time_interleaved

    ids = {name: fn() for name, fn in runs.items()}
    return ids, time_interleaved(runs, repeats, warmup=0)


def _agreement(ours: list[int], theirs: list[int]) -> dict[str, Any]:
    same = 0
    while same < min(len(ours), len(theirs)) and ours[same] == theirs[same]:
        same += 1
    return {"same_ids": ours == theirs, "same_leading_tokens": same}


def _skip_reason() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install llama-cpp-python)"
    try:
        import llama_cpp  # noqa: F401 - its shared library loads here
    except (ImportError, OSError) as exc:
        return f"llama-cpp-python does not load: {exc}".splitlines()[0]
    return None


def run(repeats: int = 10, threads: int | None = None) -> dict[str, Any]:
    """All figures as a dict; prints nothing. `threads` sets torch's CPU threads, and so llama.cpp's,
    for the run."""
    skipped = _skip_reason()
    if skipped:
        return {"skipped": skipped}
    import llama_cpp

    from scratchlm.gguf.export import export_gguf
    from scratchlm.checkpoint import load_model

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
            train_s = _train(Path(tmp) / "run")
            model, tokenizer, _ = load_model(Path(tmp) / "run")
            exports = {dtype: export_gguf(model, tokenizer, Path(tmp) / f"model-{dtype}.gguf", dtype, name="bench-gguf")
                       for dtype in DTYPES}
            prompt = tokenizer.encode(PROMPT)
            new_tokens = model.config.block_size - len(prompt)
            load_before = os.getloadavg()
            runs = _decoders(model, {d: e.path for d, e in exports.items()}, prompt, new_tokens, exports["f32"].n_vocab)
            ids, times = _time(runs, repeats)
            del runs  # the Llama objects, before their files go
        result_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    decoders = {name: {"min_s": min(t), "median_s": statistics.median(t), "runs": len(t),
                       "best_tok_s": new_tokens / min(t), "median_tok_s": new_tokens / statistics.median(t)}
                for name, t in times.items()}
    return {
        "torch": torch.__version__, "llama_cpp": llama_cpp.__version__, "threads": result_threads, "cpus": os.cpu_count(),
        "load_before": load_before, "load_after": os.getloadavg(),
        "model": {"train": "scratchlm " + " ".join(TRAIN), "train_s": train_s, "params": model.num_params(),
                  "arch": exports["f32"].arch, "context": model.config.block_size, "n_vocab": exports["f32"].n_vocab,
                  "file_mb": {d: e.nbytes / 1e6 for d, e in exports.items()}},
        "prompt": PROMPT, "prompt_tokens": len(prompt), "new_tokens": new_tokens, "decoders": decoders,
        "ratios": {f"{OURS} / llama.cpp {d}": decoders[OURS]["median_tok_s"] / decoders[f"llama.cpp {d}"]["median_tok_s"]
                   for d in DTYPES},
        "agreement": {f"llama.cpp {d}": _agreement(ids[OURS], ids[f"llama.cpp {d}"]) for d in DTYPES},
        "ids": ids,
    }


def print_report(r: dict[str, Any]) -> None:
    if "skipped" in r:
        print(f"skipped: {r['skipped']}")
        return
    m = r["model"]
    print(f"torch {r['torch']}, llama-cpp-python {r['llama_cpp']}, {r['threads']} threads of {r['cpus']} CPUs, "
          f"load average before {r['load_before'][0]:.1f}, after {r['load_after'][0]:.1f}")
    print(f"model: `{m['train']}` ({m['train_s']:.0f} s), {m['params'] / 1e6:.2f}M parameters, llama.cpp {m['arch']}, "
          f"context {m['context']}, {m['n_vocab']} tokens; files "
          + ", ".join(f"{d} {mb:.1f} MB" for d, mb in m["file_mb"].items()))
    print(f"batch 1, prompt {r['prompt_tokens']} tokens ({r['prompt']!r}), {r['new_tokens']} new tokens, greedy")
    print(f"  {'decoder':<16}{'best tok/s':>11}{'median tok/s':>14}{'runs':>6}")
    for name, d in r["decoders"].items():
        print(f"  {name:<16}{d['best_tok_s']:>11.1f}{d['median_tok_s']:>14.1f}{d['runs']:>6}")
    for name, ratio in r["ratios"].items():
        print(f"  {name}: {ratio:.2f}x (medians)")
    for name, a in r["agreement"].items():
        print(f"  {name} greedy ids same as {OURS}'s: {a['same_ids']} (first {a['same_leading_tokens']} agree)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per decoder (default: 10)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both (default: torch's choice)")
    args = parser.parse_args()
    print_report(run(args.repeats, args.threads))


if __name__ == "__main__":
    main()
