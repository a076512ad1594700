"""Time `scratchlm prepare` end to end on the built-in Shakespeare corpus.

    python benchmarks/bench_prepare.py                      # bpe, 8192 tokens (the issue's target)
    python benchmarks/bench_prepare.py --tokenizer char
    python benchmarks/bench_prepare.py --tokenizer gpt2 --tokenizer-file ../shared/data/gpt2/gpt2.tiktoken

Runs the real command in a fresh process (so Python start-up and imports count), into a
temporary folder, and prints the command's own report plus the wall-clock time. The machine's
load average is printed too: on a shared machine other processes slow every figure down.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

GOAL_SECONDS = 10.0


def _flags(tokenizer: str, vocab_size: int | None, tokenizer_file: str | None) -> list[str]:
    flags = ["--data", "shakespeare", "--tokenizer", tokenizer]
    if tokenizer == "bpe":
        flags += ["--vocab-size", str(vocab_size or 8192)]
    if tokenizer_file:
        flags += ["--tokenizer-file", tokenizer_file]
    return flags


def run(repeats: int = 3, tokenizer: str = "bpe", vocab_size: int | None = 8192,
        tokenizer_file: str | None = None, echo: bool = False) -> dict[str, Any]:
    """Wall-clock seconds of each run and the command's own timings (from its meta.json)."""
    flags = _flags(tokenizer, vocab_size, tokenizer_file)
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            cmd = [sys.executable, "-m", "scratchlm", "prepare", *flags, "--out", out]
            load = os.getloadavg()[0]
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            elapsed = time.perf_counter() - start
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
            with open(os.path.join(out, "meta.json"), encoding="utf-8") as f:
                meta = json.load(f)
        if echo:
            print(proc.stdout.rstrip())
            print(f"wall clock {elapsed:.2f} s (load average {load:.1f} on {os.cpu_count()} cores)\n")
        mb = meta["input_bytes"] / 1e6
        runs.append({"wall_s": elapsed, "load": load, "inside_s": meta["seconds"]["total"],
                     "tokenizer_s": meta["seconds"]["tokenizer"], "encode_s": meta["seconds"]["encode"],
                     "input_mb": mb, "mb_per_s": mb / elapsed})
    walls = [r["wall_s"] for r in runs]
    median = statistics.median(walls)
    return {
        "command": "scratchlm prepare " + " ".join(flags), "runs": runs, "min_s": min(walls), "median_s": median,
        "median_mb_per_s": runs[0]["input_mb"] / median,
        "targets": [{"target": "prepare shakespeare bpe 8192 end to end, s", "ratio": median, "goal": GOAL_SECONDS,
                     "met": median <= GOAL_SECONDS, "lower_is_better": True}] if tokenizer == "bpe" else [],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="bpe", choices=["char", "bpe", "gpt2"])
    parser.add_argument("--vocab-size", type=int, default=None, help="bpe only (default: 8192)")
    parser.add_argument("--tokenizer-file", default=None)
    parser.add_argument("--repeat", type=int, default=1, help="runs (the best and the median are reported)")
    args = parser.parse_args()
    r = run(args.repeat, args.tokenizer, args.vocab_size, args.tokenizer_file, echo=True)
    print(f"{r['command']}: best {r['min_s']:.2f} s, median {r['median_s']:.2f} s of {len(r['runs'])} "
          f"({r['median_mb_per_s']:.1f} MB/s of text end to end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
