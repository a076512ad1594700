"""Time to loss: our training presets beside the classic recipe, on Tiny Shakespeare characters.

The peer (benchmarks/peer_classic.py) is the classic CPU baby-GPT recipe written with Hugging
Face's GPT2LMHeadModel and torch.optim.AdamW. Each of our presets trains as a user runs it
(`scratchlm train --preset NAME --data tinyshakespeare.txt`), in this process: its own steps,
schedule, evaluations, samples and checkpoints all count in its time. For both, the figure is the
training time to the first validation loss <= 1.88 over the whole validation split (the file's
last 10%, consecutive windows), probed every few steps late in the run; the probes' own time is
left out. Runs alternate (peer, then each preset, repeated), so load changes hit everyone alike.

Targets, as ratios to the peer measured in the same run:
- the fastest preset's time to the loss, every one of its runs against the peer's median: <= 0.33;
- our fp32 baby step (the `shakespeare-char` preset, AdamW, float32) in tokens/s: >= 1.2x the peer's.
A peer run that never reaches the loss in its 2000 steps counts with its whole training time
(which understates its time to the loss, so the ratio is on the safe side for the peer).

    python -m benchmarks.bench_time_to_loss                       # 3 runs of each, about 12 minutes
    python -m benchmarks.bench_time_to_loss --repeats 1
    python -m benchmarks.bench_time_to_loss --no-native-bf16      # as a CPU without bfloat16 units

Takes minutes; never run as a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/bench_time_to_loss.py`

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
GOAL_LOSS = 1.88
GOAL_TIME_RATIO = 0.33  # our fastest preset's time to the loss / the peer's
GOAL_STEP_RATIO = 1.2  # our fp32 baby step's tokens/s / the peer's
PRESETS = ("shakespeare-char", "shakespeare-char-fast")
NO_BF16_ENV = {"SCRATCHLM_CPU_BF16": "0", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}


def one_run(preset: str, data: Path, workdir: Path, probe_from: float = 0.4, probes: int = 24,
            **overrides: Any) -> dict[str, Any]:
    """One training of `preset`; from probe_from of its steps on, the whole validation split is
    scored every max_steps / probes steps until it reaches the goal (the run then stops)."""
    from scratchlm.training import train as train_module
    from scratchlm.training.evaluation import evaluate_full
    from scratchlm.training.state import TrainState
    from scratchlm.training.train import config_from_preset, train

    cfg = config_from_preset(preset, data=str(data), out_dir=str(workdir / f"run-{time.time_ns()}"),
                             data_cache=str(workdir / "cache"), progress="quiet", **overrides)
    every = max(1, cfg.max_steps // probes) if probes else 1
    first = int(cfg.max_steps * probe_from)
    runs: list = []  # (setup, parts, state) of the run: the benchmark needs its model, validation tokens and clock
    make_parts, begin = train_module.make_parts, TrainState.begin

    def keep_parts(model, setup):
        parts = make_parts(model, setup)
        runs.append([setup, parts, None])
        return parts

    def keep_state(self, *args, **kwargs):
        runs[-1][2] = self
        return begin(self, *args, **kwargs)

    probe_s, evals, reached = 0.0, [], {}

    def on_step(step: int, record: dict) -> bool:
        nonlocal probe_s
        if step < first or (step % every and step != cfg.max_steps) or not probes:
            return False
        setup, parts, state = runs[-1]
        t0 = time.perf_counter()
        trained = t0 - state.t_start - probe_s
        # the probes' windows in batches of 64: the same loss, sooner
        probing = dataclasses.replace(setup, cfg=dataclasses.replace(setup.cfg, batch_size=64))
        val = evaluate_full(parts.model, probing)
        probe_s += time.perf_counter() - t0
        evals.append((step, trained, val))
        if val <= GOAL_LOSS:
            reached.update(step=step, time_s=trained, val_loss=val)
            return True
        return False

    train_module.make_parts, TrainState.begin = keep_parts, keep_state
    try:
        result = train(cfg, on_step=on_step)
    finally:
        train_module.make_parts, TrainState.begin = make_parts, begin
    return {"time_s": reached.get("time_s"), "reached_step": reached.get("step"),
            "val_loss": reached.get("val_loss", evals[-1][2] if evals else result.val_loss),
            "train_s": result.elapsed_s - probe_s, "steps": result.step, "max_steps": cfg.max_steps,
            "tokens_per_s": result.tokens_seen / max(result.elapsed_s - probe_s, 1e-9), "evals": evals}


def step_speed(data: Path, rounds: int = 5, steps: int = 30) -> dict[str, float]:
    """Tokens/s of one training step at the baby shape, steady state, interleaved: our fp32
    `shakespeare-char` step through the trainer's own step function (scratchlm.training.train.train_step:
    fused loss, foreach clipping, fused AdamW) beside the peer's (peer_classic.make_step), both on
    random batches of the file's characters. Medians over `rounds` blocks of `steps` steps."""
    import torch

    from benchmarks import peer_classic
    from scratchlm.training.distributed import Dist
    from scratchlm.kernels.training_copy import attach_training_kernels
    from scratchlm.model.gpt import GPT
    from scratchlm.training.optim import make_optimizer
    from scratchlm.training.train import TrainParts, config_from_preset, train_step

    peer_step, vocab = peer_classic.make_step(data)
    cfg = config_from_preset("shakespeare-char", fused_loss=True)
    torch.manual_seed(0)
    model = GPT(cfg.model_config(vocab + 2)).train()  # scratchlm's char vocabulary adds BOS and EOS
    attach_training_kernels(model)  # as a CPU run's training does (scratchlm.training.parts)
    optimizer = make_optimizer(model, cfg, torch.device("cpu"))
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    gen = torch.Generator().manual_seed(0)

    class Batches:  # the trainer's stream interface: next_batch() -> (x, y)
        def next_batch(self):
            rows = torch.randint(0, vocab, (cfg.batch_size, 65), generator=gen)
            return rows[:, :-1], rows[:, 1:]

    stream, d = Batches(), Dist()
    parts = TrainParts(model=model, forward=model, optimizer=optimizer, scaler=scaler, batches=stream)
    ours = lambda: train_step(parts, cfg, d, torch.device("cpu"))  # noqa: E731
    times: dict[str, list[float]] = {"ours": [], "peer": []}
    for name, step in (("ours", ours), ("peer", peer_step)):
        for _ in range(10):  # warm-up
            step()
    for _ in range(rounds):
        for name, step in (("ours", ours), ("peer", peer_step)):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times[name].append(cfg.batch_size * 64 * steps / (time.perf_counter() - start))
    return {f"{name}_tokens_per_s": statistics.median(t) for name, t in times.items()}


def run(presets: tuple[str, ...] = PRESETS, repeats: int = 3, data: Path = DATA,
        threads: int | None = None) -> dict[str, Any]:
    """All figures as a dict; prints nothing. Skips (with a reason) when the data file is missing."""
    import torch

    from benchmarks import peer_classic
    from scratchlm.machine import cpu

    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    result: dict[str, Any] = {"data": str(data), "goal_loss": GOAL_LOSS, "threads": threads,
                              "load_before": os.getloadavg(), "cpu": cpu.cpu_name(), "bf16_native": cpu.bf16_reason(),
                              "forced": {k: os.environ[k] for k in NO_BF16_ENV if k in os.environ}}
    if not data.exists():
        result.update(skipped=f"{data} is missing", targets=[])
        return result
    peer_runs: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for preset in presets:  # the first run of each preset also prepares (caches) the data
            one_run(preset, data, work, probes=0, max_steps=1, eval_interval=0, sample_tokens=0, threads=threads)
        for _ in range(repeats):
            peer_runs.append(peer_classic.run(data, goal=GOAL_LOSS, threads=threads))
            for preset in presets:
                runs.setdefault(preset, []).append(one_run(preset, data, work, threads=threads))
        result["step"] = step_speed(data)
    result["load_after"] = os.getloadavg()
    result["peer"] = _summary(peer_runs, time_key="reached_s")
    result["presets"] = {p: _summary(rs) for p, rs in runs.items()}
    result["targets"] = target_rows(result["presets"], result["peer"], result["step"])
    return result


def _summary(rs: list[dict[str, Any]], time_key: str = "time_s") -> dict[str, Any]:
    """Median time to the loss (a run that never reached it counts with its whole training time)."""
    times = [r[time_key] if r[time_key] is not None else r["train_s"] for r in rs]
    return {"runs": rs, "reached": all(r[time_key] is not None for r in rs), "median_s": statistics.median(times),
            "max_s": max(times), "min_s": min(times),
            "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs)}


def target_rows(presets: dict[str, dict[str, Any]], peer: dict[str, Any] | None,
                step: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The fastest preset that reached the loss in every run (or the fastest of all, then not
    met), every run against the peer's median; and our fp32 baby step's tokens/s against the
    peer's, measured interleaved (step_speed)."""
    if not presets or not peer:
        return []
    reached = [p for p in presets if presets[p]["reached"]] or list(presets)
    best = min(reached, key=lambda p: presets[p]["median_s"])
    ratio = presets[best]["max_s"] / peer["median_s"]
    rows = [{"target": f"time to val loss {GOAL_LOSS}, slowest run of the fastest preset ({best}) / the classic "
                       "recipe's median", "ratio": ratio, "goal": GOAL_TIME_RATIO, "lower_is_better": True,
             "met": presets[best]["reached"] and ratio <= GOAL_TIME_RATIO}]
    if step:
        ratio = step["ours_tokens_per_s"] / step["peer_tokens_per_s"]
        rows.append({"target": "fp32 baby step tokens/s (shakespeare-char, steady state) / the classic recipe's",
                     "ratio": ratio, "goal": GOAL_STEP_RATIO, "met": ratio >= GOAL_STEP_RATIO})
    return rows


def print_report(r: dict[str, Any]) -> None:
    forced = " ".join(f"{k}={v}" for k, v in r.get("forced", {}).items())
    print(f"time to loss on {r['data']}, {r['threads']} threads{', ' + forced if forced else ''}, load average "
          f"before {r['load_before'][0]:.1f}" + (f", after {r['load_after'][0]:.1f}" if "load_after" in r else ""))
    if "skipped" in r:
        print(f"  skipped: {r['skipped']}")
        return
    print(f"  cpu {r['cpu']}; bfloat16 native: {r['bf16_native'][0]} ({r['bf16_native'][1]})")
    print(f"  {'who':<24}{'reached':>8}{'min s':>8}{'median s':>10}{'max s':>8}{'median tok/s':>14}  val at the goal")
    for who, s in [("classic recipe (HF peer)", r["peer"]), *r["presets"].items()]:
        losses = ", ".join(f"{x.get('val_loss', x.get('final_val_loss')):.3f}" for x in s["runs"])
        print(f"  {who:<24}{'yes' if s['reached'] else 'NO':>8}{s['min_s']:>8.1f}{s['median_s']:>10.1f}"
              f"{s['max_s']:>8.1f}{s['median_tokens_per_s']:>14,.0f}  {losses}")
    if "step" in r:
        print(f"  steady-state step, interleaved: ours fp32 {r['step']['ours_tokens_per_s']:,.0f} tokens/s, "
              f"the classic recipe {r['step']['peer_tokens_per_s']:,.0f}")
    for t in r["targets"]:
        sign = "<=" if t.get("lower_is_better") else ">="
        print(f"  {t['target']}: {t['ratio']:.2f} (goal {sign} {t['goal']})  {'met' if t['met'] else 'NOT met'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), help="training presets to time")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default: 3)")
    parser.add_argument("--data", type=Path, default=DATA, help=f"the text file (default: {DATA})")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of each training (default: torch's)")
    parser.add_argument("--no-native-bf16", action="store_true",
                        help="as a CPU without bfloat16 units (SCRATCHLM_CPU_BF16=0, oneDNN held below AVX512-BF16); "
                             "re-runs itself in a fresh process so oneDNN reads the setting at start")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    from scratchlm.envflags import env_switch

    if args.no_native_bf16 and env_switch("SCRATCHLM_CPU_BF16") is not False:
        import subprocess

        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--no-native-bf16"]
        sys.exit(subprocess.call([sys.executable, "-m", "benchmarks.bench_time_to_loss", *rest],
                                 env={**os.environ, **NO_BF16_ENV}, cwd=Path(__file__).resolve().parent.parent))
    result = run(tuple(args.presets), args.repeats, args.data, args.threads)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print_report(result)


if __name__ == "__main__":
    main()
