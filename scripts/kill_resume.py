"""Crash safety, measured: SIGKILL a CPU training run at random instants, resume it, repeat.

    python scripts/kill_resume.py --kills 25            # the documented figure (about 2 minutes)
    python scripts/kill_resume.py --kills 3 --json      # what tests/test_crash.py runs

First an uninterrupted reference run (a tiny model, dropout on, a checkpoint after every step) is
trained with `python -m scratchlm train`. Then the same run is started again and killed with
SIGKILL at a random instant of its training phase (often in the middle of a checkpoint write),
resumed with `scratchlm train --resume`, killed again, and so on; after the last kill it resumes
to the end. After every kill the checkpoint that `latest` names must load, and its weights and
optimizer state must be bit-identical to the reference run's checkpoint of the same step; at the
end the final checkpoint must be bit-identical too. One thread everywhere, so summation orders
agree. A kill before the first checkpoint leaves a run folder with no checkpoint, which cannot be
resumed; the script then deletes it and starts afresh (and says so), and counts that kill as one
that left nothing to compare, never as identical. `--first-kill-before-checkpoint` forces such a
kill: the first run is held at its first line of output (its stdout a pipe filled beforehand, so
the write blocks), after its folder is made and before its first step, and killed there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = "the a king queen speaks runs to of and in my thy lord love night day sword crown".split()


def write_corpus(path: Path, n_lines: int = 300, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "." for _ in range(n_lines)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_argv(corpus: Path, out_dir: Path, cache: Path, steps: int, seed: int) -> list[str]:
    return [
        "train", "--preset", "shakespeare-char", "--data", str(corpus), "--tokenizer", "char",
        "--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--block_size", "16", "--dropout", "0.1",
        "--batch_size", "4", "--max_steps", str(steps), "--warmup_steps", "5", "--lr", "3e-3",
        "--eval_interval", "0", "--eval_iters", "2", "--sample_tokens", "0", "--log_interval", "1",
        "--checkpoint_interval", "1", "--threads", "1", "--seed", str(seed), "--progress", "lines",
        "--out_dir", str(out_dir), "--data_cache", str(cache),
    ]


class _Run:
    """A `python -m scratchlm ...` process whose stdout is watched for the start of training."""

    def __init__(self, argv: list[str], env: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "scratchlm", *argv], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.training = threading.Event()  # set at the "run ...: N parameters" line
        self.lines: list[str] = []
        self.err = ""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("run "):
                self.training.set()
        self.training.set()  # ended (or died) without training: stop waiting

    def _read_err(self) -> None:
        self.err = self.proc.stderr.read()

    def wait(self) -> int:
        code = self.proc.wait()
        self.training.wait(5)
        return code


def _full_pipe() -> tuple[int, int]:
    """(read end, write end) of a pipe whose buffer is full: a blocking write to it waits."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    for chunk in (b"\n" * 4096, b"\n"):  # then byte by byte: not even a short line may fit
        try:
            while True:
                os.write(w, chunk)
        except BlockingIOError:
            pass
    os.set_blocking(w, True)
    return r, w


def kill_before_first_checkpoint(argv: list[str], env: dict, run: Path, timeout: float = 120) -> int:
    """Start a fresh run whose stdout is a full pipe, so it blocks at its first printed line
    (the one announcing the run, printed after its folder and its `start` record are made and
    before its first step); once that record is there, SIGKILL it. Returns its exit status."""
    r, w = _full_pipe()
    proc = subprocess.Popen([sys.executable, "-m", "scratchlm", *argv], cwd=REPO, env=env, stdout=w,
                            stderr=subprocess.DEVNULL)
    os.close(w)
    try:
        deadline = time.monotonic() + timeout
        metrics = run / "metrics.jsonl"
        while not (metrics.is_file() and '"start"' in metrics.read_text(encoding="utf-8")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the run to be held before its first step ended or never started "
                                   f"(exit status {proc.poll()})")
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(r)


def _tensors(ckpt: Path) -> dict:
    """Every tensor of a checkpoint: its weights and its optimizer state, by name."""
    import torch

    from scratchlm.checkpoint import load_training_state
    from safetensors.torch import load_file

    out = {f"w.{k}": v for k, v in load_file(str(ckpt / "model.safetensors")).items()}
    optimizer_state, _ = load_training_state(ckpt)
    for index, state in optimizer_state["optimizer"]["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"opt.{index}.{key}"] = value
    return out


def bit_identical(a: Path, b: Path) -> bool:
    import torch

    ta, tb = _tensors(a), _tensors(b)
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) and ta[k].dtype == tb[k].dtype for k in ta)


def _judge(run: Path, ref: Path, done: int, code: int, number: int, log) -> dict:
    """What a kill left: the step `latest` names (it must load whole) and whether that checkpoint
    is bit-identical to the reference's of the same step; None when there is no checkpoint yet."""
    from scratchlm.fileio import STAGED_PREFIX
    from scratchlm.checkpoint import latest_checkpoint, load_model

    mid_save = any(run.glob(STAGED_PREFIX + "*"))  # the kill landed inside a checkpoint write
    after = latest_checkpoint(run)
    step = None if after is None else int(after.name.split("-")[1])
    same = None  # no checkpoint yet: nothing to compare, and counted as such, not as identical
    if after is not None:
        load_model(run)  # `latest` must always load whole
        same = bit_identical(after, ref / after.name)
    verdict = "no checkpoint yet" if same is None else "bit-identical" if same else "DIFFERS"
    log(f"kill {number}: resumed at step {done}, killed at step ~{step}{' inside a save' if mid_save else ''}; "
        f"latest checkpoint {verdict}")
    return {"kill": number, "from_step": done, "latest_step": step, "exit": code, "mid_save": mid_save,
            "identical": same}


def _fresh_or_resume(run: Path, fresh_argv: list[str]) -> tuple[list[str], int, bool]:
    """(argv, step it starts from, whether the folder was deleted): a run folder without a
    checkpoint (killed before its first) cannot be resumed, so it is deleted and started afresh."""
    from scratchlm.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run)
    if latest is not None:
        return ["train", "--resume", str(run), "--progress", "lines"], int(latest.name.split("-")[1]), False
    deleted = run.exists()
    if deleted:
        shutil.rmtree(run)
    return fresh_argv, 0, deleted


def _reference_run(argv: list[str], env: dict, ref: Path) -> float:
    """Train the uninterrupted run; return its seconds per step (with its save), from the run's
    own log, so start-up is not part of it."""
    reference = _Run(argv, env)
    if reference.wait() != 0:
        raise RuntimeError(f"the reference run failed:\n{reference.err}")
    times = [e["time"] for e in map(json.loads, (ref / "metrics.jsonl").read_text().splitlines()) if e["event"] == "train"]
    return (times[-1] - times[0]) / max(1, len(times) - 1)


def _summary_line(result: dict) -> str:
    return (f"{result['kills']} kills ({result['kills_inside_a_save']} inside a checkpoint write), "
            f"{result['cycles_identical']} left a bit-identical latest checkpoint, "
            f"{result['cycles_without_checkpoint']} none yet (nothing compared); "
            f"final step {result['final_step']}/{result['steps']}: weights and optimizer state "
            f"{'bit-identical' if result['final_identical'] else 'DIFFERENT'} to the uninterrupted run "
            f"({result['seconds']}s)")


def run_kill_resume(kills: int, steps: int | None = None, seed: int = 0, workdir: Path | None = None,
                    log=print, first_kill_before_checkpoint: bool = False) -> dict:
    """Train a reference run, then the same run through `kills` SIGKILLs and resumes; compare.
    first_kill_before_checkpoint: the first kill lands before the run's first step (see above)."""
    from scratchlm.checkpoint import latest_checkpoint

    steps = steps or max(40, 6 * kills)
    own_dir = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="kill-resume-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    env = {**os.environ, "SCRATCHLM_CACHE": str(workdir / "cache"), "PYTHONWARNINGS": "ignore"}
    corpus = write_corpus(workdir / "corpus.txt")
    ref, run, data_cache = workdir / "reference", workdir / "killed", workdir / "data"
    fresh = train_argv(corpus, run, data_cache, steps, seed)
    try:
        t0 = time.perf_counter()
        per_step = _reference_run(train_argv(corpus, ref, data_cache, steps, seed), env, ref)
        log(f"reference: {steps} steps in {time.perf_counter() - t0:.1f}s ({1000 * per_step:.0f} ms/step with its save)")

        cycles, restarts_from_scratch = [], 0
        if first_kill_before_checkpoint and kills:
            code = kill_before_first_checkpoint(fresh, env, run)
            cycles.append(_judge(run, ref, 0, code, 1, log))
        while len(cycles) < kills:
            argv, done, deleted = _fresh_or_resume(run, fresh)
            restarts_from_scratch += deleted
            if done >= steps:
                raise RuntimeError(f"the run finished after {len(cycles)} kills; give more --steps")
            proc = _Run(argv, env)
            proc.training.wait()
            # a random instant of the training phase, spread so the run does not finish before the last kill
            left = kills - len(cycles)
            time.sleep(rng.uniform(0, 2 * per_step * (steps - done) / (left + 1)))
            proc.proc.send_signal(signal.SIGKILL)
            code = proc.wait()
            if code != -signal.SIGKILL:  # it ended by itself before the kill: finished early, or failed
                raise RuntimeError(f"kill {len(cycles) + 1}: the run ended by itself with exit status {code}:\n{proc.err}")
            cycles.append(_judge(run, ref, done, code, len(cycles) + 1, log))

        argv, done, deleted = _fresh_or_resume(run, fresh)
        restarts_from_scratch += deleted
        if done < steps:  # a last kill that landed after the final save left nothing to train (a resume refuses that)
            final = _Run(argv, env)
            if final.wait() != 0:
                raise RuntimeError(f"the last run failed:\n{final.err}")
        last = latest_checkpoint(run)
        final_same = last is not None and last.name == latest_checkpoint(ref).name and bit_identical(last, ref / last.name)
        result = {
            "kills": len(cycles), "steps": steps, "cycles_identical": sum(c["identical"] is True for c in cycles),
            "cycles_without_checkpoint": sum(c["identical"] is None for c in cycles),
            "kills_inside_a_save": sum(c["mid_save"] for c in cycles),
            "final_step": None if last is None else int(last.name.split("-")[1]),
            "final_identical": bool(final_same), "restarts_from_scratch": restarts_from_scratch,
            "seconds": round(time.perf_counter() - t0, 1), "cycles": cycles,
        }
        log(_summary_line(result))
        return result
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=25, help="SIGKILLs to deliver (default: 25)")
    parser.add_argument("--steps", type=int, default=None, help="planned optimizer steps (default: max(40, 6 x kills))")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run and of the kill instants (default: 0)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the runs here (default: a temp dir, removed)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    parser.add_argument("--first-kill-before-checkpoint", action="store_true",
                        help="make the first kill land before the run's first step (it leaves no checkpoint)")
    args = parser.parse_args()
    result = run_kill_resume(args.kills, args.steps, args.seed, args.workdir,
                             first_kill_before_checkpoint=args.first_kill_before_checkpoint)
    if args.json:
        print(json.dumps(result, indent=1))
    ok = result["final_identical"] and result["cycles_identical"] + result["cycles_without_checkpoint"] == result["kills"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
