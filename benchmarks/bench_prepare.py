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
import os
import subprocess
import sys
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="bpe", choices=["char", "bpe", "gpt2"])
    parser.add_argument("--vocab-size", type=int, default=None, help="bpe only (default: 8192)")
    parser.add_argument("--tokenizer-file", default=None)
    parser.add_argument("--repeat", type=int, default=1, help="runs (the best is reported)")
    args = parser.parse_args()

    flags = ["--data", "shakespeare", "--tokenizer", args.tokenizer]
    if args.tokenizer == "bpe":
        flags += ["--vocab-size", str(args.vocab_size or 8192)]
    if args.tokenizer_file:
        flags += ["--tokenizer-file", args.tokenizer_file]
    times = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "scratchlm", "prepare", *flags, "--out", os.path.join(tmp, "out")]
            load = os.getloadavg()[0]
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        print(proc.stdout.rstrip())
        print(f"wall clock {elapsed:.2f} s (load average {load:.1f} on {os.cpu_count()} cores)\n")
        times.append(elapsed)
    print(f"scratchlm prepare {' '.join(flags)}: best {min(times):.2f} s of {len(times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
