"""Memory of LoRA fine-tuning beside full fine-tuning: GPT-2 124M's shape and vocabulary, on a CPU.

A model of `gpt2-124m`'s config (12 layers, width 768, GPT-2's 50,257 ids) is saved with GPT-2's
tokenizer (../shared/data/gpt2/gpt2.tiktoken) as the `--init_from` source; its weights are a
fresh initialisation (the real GPT-2 weights need the network), which needs the same memory.
Each mode then runs `scratchlm sft` on the same 64 short conversations for STEPS steps, in a
process of its own, and reports that process's peak resident memory (ru_maxrss, everything from
the interpreter's start on: torch, the source's weights, the data, the optimizer):

    full   every weight trains: AdamW holds two moments of each, and each has a gradient
    lora   --lora_rank 8 on every block matrix: the weights are frozen and only A, B and the
           chat tokens' rows have gradients and moments

Goal: lora's peak at most 0.5 x full's. Both run in this sitting, one after the other.

    python -m benchmarks --only lora-memory
    python -m benchmarks.bench_lora --json out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python benchmarks/bench_lora.py`

RANKS = ROOT.parent / "shared" / "data" / "gpt2" / "gpt2.tiktoken"
STEPS = 3
RANK = 8
GOAL = 0.5
MODES = {"full": {}, "lora": {"lora_rank": RANK}}


def _source(workdir: Path) -> Path:
    """The gpt2-124m-shaped source run with GPT-2's tokenizer."""
    import torch

    from scratchlm.checkpoint import save_model_checkpoint
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT
    from scratchlm.text.byte_bpe import GPT2Tokenizer

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("gpt2-124m", dropout=0.0))
    return save_model_checkpoint(model, GPT2Tokenizer.from_rank_file(RANKS), workdir / "source")


def _conversations(path: Path) -> Path:
    topics = ["the sea", "a river", "the moon", "autumn", "a city", "the wind", "a garden", "winter"]
    rows = [{"messages": [{"role": "user", "content": f"Write one line about {t}, number {i}."},
                          {"role": "assistant", "content": f"Here is a line about {t}: it moves, and it stays."}]}
            for i in range(8) for t in topics]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _child(mode: str, source: str, data: str, out: str) -> dict[str, Any]:
    """One fine-tune in this process; its peak RSS and seconds."""
    from scratchlm.training.train import config_from_preset, train

    cfg = config_from_preset("sft", init_from=source, data=data, out_dir=out, batch_size=4, max_steps=STEPS,
                             eval_interval=0, checkpoint_interval=STEPS, progress="quiet", threads=None, **MODES[mode])
    t0 = time.perf_counter()
    train(cfg)
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
            "seconds": time.perf_counter() - t0}


def run() -> dict[str, Any]:
    if not RANKS.is_file():
        return {"skipped": f"no GPT-2 rank file at {RANKS}"}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        source, data = _source(workdir), _conversations(workdir / "chats.jsonl")
        modes = {}
        for mode in MODES:
            out = workdir / f"{mode}.json"
            subprocess.run([sys.executable, "-m", "benchmarks.bench_lora", "--child", mode, "--source", str(source),
                            "--data", str(data), "--out", str(workdir / mode), "--json", str(out)],
                           cwd=ROOT, check=True)
            modes[mode] = json.loads(out.read_text(encoding="utf-8"))
    ratio = modes["lora"]["peak_rss_mb"] / modes["full"]["peak_rss_mb"]
    return {"model": "gpt2-124m shape, GPT-2 vocabulary", "steps": STEPS, "batch": 4, "rank": RANK, "modes": modes,
            "ratio": ratio, "goal": GOAL, "met": ratio <= GOAL}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=list(MODES))
    parser.add_argument("--source")
    parser.add_argument("--data")
    parser.add_argument("--out")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    result = _child(args.child, args.source, args.data, args.out) if args.child else run()
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
