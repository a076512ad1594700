"""Which runs the playground serves and how it loads them (scratchlm/serve/library.py): only
listed names, nothing that leads outside the runs folder, a run with no checkpoint yet, a run
trained again under the same checkpoint name, and a checkpoint served alone."""

from __future__ import annotations

import os
import time

import pytest
import torch

from helpers import Served, request


@pytest.mark.parametrize("name", ["..", "../mixed", "mixed/..", "/etc", "%2e%2e", "..%2Fmixed", "mixed%00", "outside",
                                  "linked", "./mixed", "mixed/", "~", ""])
def test_a_run_is_only_ever_a_listed_name(served, runs, name):
    """Path forms, encoded or not, and a symlink to a run outside the folder: none is served."""
    from urllib.parse import quote

    outside = runs.parent / "outside"
    if not outside.exists():
        import shutil

        shutil.copytree(runs / "mixed", outside)
        (runs / "linked").symlink_to(outside, target_is_directory=True)
    names = [r["name"] for r in request(served.port, "GET", "/api/runs")[1]["runs"]]
    assert names == ["mixed"]
    for path in (f"/api/model?run={quote(name)}", f"/api/model?run={name}", f"/api/inside?run={quote(name)}",
                 f"/api/training?run={quote(name)}&since=0"):
        got, answer = request(served.port, "GET", path)
        assert got == 404, (path, answer)
    got, answer = request(served.port, "POST", "/api/attention", {"run": name, "text": "The"})
    assert got == 404


def test_a_run_whose_files_lead_outside_is_refused(tmp_path, runs):
    """A listed run whose checkpoint or tokenizer is a symlink out of the runs folder."""
    import shutil

    from scratchlm.serve.library import RunLibrary, UnknownRun

    folder = tmp_path / "runs"
    shutil.copytree(runs / "mixed", folder / "sneaky")
    shutil.move(folder / "sneaky" / "tokenizer", tmp_path / "tokenizer")
    (folder / "sneaky" / "tokenizer").symlink_to(tmp_path / "tokenizer", target_is_directory=True)
    library = RunLibrary(runs=folder)
    assert [e.name for e in library.entries()] == ["sneaky"]
    with pytest.raises(UnknownRun, match="outside"):
        library.load("sneaky")


def test_a_run_with_no_checkpoint_yet_says_so_without_the_servers_paths(tmp_path):
    from scratchlm.errors import UserError
    from scratchlm.serve.library import RunLibrary

    (tmp_path / "runs" / "young").mkdir(parents=True)
    (tmp_path / "runs" / "young" / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')
    library = RunLibrary(runs=tmp_path / "runs")
    assert [e.name for e in library.entries()] == ["young"]
    with pytest.raises(UserError, match="run young: no checkpoint yet") as caught:
        library.load("young")
    assert str(tmp_path) not in str(caught.value)


def test_a_run_trained_again_under_the_same_checkpoint_name_is_loaded_afresh(tmp_path, runs):
    """The kept model is the files', not the path's: new weights written at the same checkpoint
    path (a run deleted and trained again) are what the next request gets."""
    import shutil

    from safetensors.torch import load_file, save_file

    from scratchlm.checkpoint import latest_checkpoint
    from scratchlm.serve.library import RunLibrary

    folder = tmp_path / "runs"
    shutil.copytree(runs / "mixed", folder / "again")
    library = RunLibrary(runs=folder)
    first = library.load("again")
    assert library.load("again") is first  # unchanged files: the kept model
    weights_file = latest_checkpoint(folder / "again") / "model.safetensors"
    weights = load_file(weights_file)
    weights = {name: t * 0.5 if t.is_floating_point() else t for name, t in weights.items()}
    save_file(weights, weights_file)
    later = weights_file.stat().st_mtime_ns + 2_000_000_000
    os.utime(weights_file, ns=(later, later))  # a later write, whatever the file system's clock grain
    second = library.load("again")
    assert second is not first
    state = second.model.state_dict()
    for name, t in weights.items():
        if name in state:
            assert torch.equal(state[name].cpu(), t), name


def test_a_checkpoint_served_alone_says_when_its_run_is_training(tmp_path, runs):
    """`serve --checkpoint RUN/ckpt_N`: the lock that says "training" is the run folder's."""
    import shutil

    from scratchlm.checkpoint import latest_checkpoint
    from scratchlm.runlock import RunLock
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary, describe

    run = tmp_path / "live"
    shutil.copytree(runs / "mixed", run)
    entry = RunLibrary(checkpoint=latest_checkpoint(run)).entries()[0]
    assert entry.path.parent == run and describe(entry)["training"] is False
    with RunLock(run):
        assert describe(entry)["training"] is True
        assert describe(RunLibrary(checkpoint=run).entries()[0])["training"] is True
        with Served(RunLibrary(checkpoint=latest_checkpoint(run)), Limits()) as served:
            status, answer = request(served.port, "GET", f"/api/training?run={entry.name}&since=0")
        assert status == 200 and answer["training"] is True and answer["records"]


def test_the_default_run_is_the_newest_that_can_generate(tmp_path, runs):
    """A run just started (metrics, no checkpoint) is newer than the trained one: listed first,
    marked, and not the default; with no trained run at all the newest is still the default."""
    import shutil

    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    folder = tmp_path / "runs"
    shutil.copytree(runs / "mixed", folder / "trained")
    young = folder / "young"
    young.mkdir()
    (young / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')
    later = time.time_ns() + 10_000_000_000  # newer than anything copied, whatever the clock's grain
    os.utime(young / "metrics.jsonl", ns=(later, later))
    with Served(RunLibrary(runs=folder), Limits()) as served:
        listed = request(served.port, "GET", "/api/runs")[1]
    assert [r["name"] for r in listed["runs"]] == ["young", "trained"]
    assert listed["runs"][0]["checkpoint"] is None and listed["runs"][1]["checkpoint"] is not None
    assert listed["default"] == "trained"
    shutil.rmtree(folder / "trained")
    with Served(RunLibrary(runs=folder), Limits()) as served:
        assert request(served.port, "GET", "/api/runs")[1]["default"] == "young"
