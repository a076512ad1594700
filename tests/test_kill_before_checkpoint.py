"""scripts/kill_resume.py with a kill forced before the run's first checkpoint (the run held at
its first printed line, its stdout a full pipe): the kill leaves a run folder and no checkpoint;
the script counts it as a kill with nothing to compare, never as identical, starts the run afresh
and still ends bit-identical to the uninterrupted run. Counting such a kill as identical survived
a hand mutation of issue 30 (scripts/mutate.py): test_crash's random kills rarely land there."""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("kill_resume", REPO / "scripts" / "kill_resume.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_kill_before_the_first_checkpoint_is_counted_apart_and_the_run_starts_afresh(tmp_path):
    lines = []
    result = _load_script().run_kill_resume(kills=1, steps=6, seed=0, workdir=tmp_path, log=lines.append,
                                            first_kill_before_checkpoint=True)
    [cycle] = result["cycles"]
    assert cycle["exit"] == -signal.SIGKILL and cycle["from_step"] == 0
    assert cycle["latest_step"] is None and cycle["identical"] is None  # no checkpoint: nothing compared
    assert result["cycles_identical"] == 0 and result["cycles_without_checkpoint"] == 1
    assert result["restarts_from_scratch"] == 1  # the folder the kill left was there, and was started over
    assert result["final_step"] == 6 and result["final_identical"]
    assert "no checkpoint yet" in lines[1]


@pytest.mark.slow
def test_the_held_run_had_made_its_folder_and_nothing_more_and_is_judged_so(tmp_path):
    """The hold itself: a fresh run killed at its first line has its folder, tokenizer and `start`
    record, and no checkpoint and no training step; the script's verdict on it is 'nothing to
    compare' (None), not identical."""
    import os

    script = _load_script()
    corpus = script.write_corpus(tmp_path / "corpus.txt", n_lines=60)
    run = tmp_path / "run"
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache"), "PYTHONWARNINGS": "ignore"}
    code = script.kill_before_first_checkpoint(script.train_argv(corpus, run, tmp_path / "data", 6, 0), env, run)
    assert code == -signal.SIGKILL
    assert (run / "tokenizer").is_dir() and not list(run.glob("ckpt-*")) and not (run / "latest").exists()
    events = [line.split('"event": "')[1].split('"')[0] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert events == ["start"]
    lines = []
    cycle = script._judge(run, tmp_path / "no-reference", 0, code, 1, lines.append)
    assert cycle["latest_step"] is None and cycle["identical"] is None
    assert lines == ["kill 1: resumed at step 0, killed at step ~None; latest checkpoint no checkpoint yet"]
