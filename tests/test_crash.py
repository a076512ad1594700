"""Crash safety and untrusted files.

- SIGKILL at random instants, resume, repeat: the weights end bit-identical to an uninterrupted
  run (scripts/kill_resume.py; 3 kills here, `python scripts/kill_resume.py --kills 25` for more).
- A checkpoint write that fails (an exception, a full disk): the previous checkpoint stays the one
  `latest` names and loads, and the error says what happened.
- A pickle that would create a marker file when unpickled, put wherever scratchlm reads a file:
  loading refuses it with a clear error and the marker never appears. Weights load only from
  safetensors.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from scratchlm.errors import UserError
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm import checkpoint as ck

REPO = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=37, block_size=16, n_layer=1, n_head=2, n_embd=16)


def _load_script():
    spec = importlib.util.spec_from_file_location("kill_resume", REPO / "scripts" / "kill_resume.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**TINY))


def _save(run_dir: Path, model: GPT, step: int) -> Path:
    opt = torch.optim.AdamW(model.parameters())
    return ck.save_checkpoint(run_dir, step, model.state_dict(), ck.SavedConfig(model=model.config.to_dict()),
                              optimizer_state={"optimizer": opt.state_dict()}, trainer_state={"step": step})


def _assert_latest_is(run_dir: Path, step: int, model: GPT) -> None:
    assert (run_dir / "latest").read_text().strip() == ck.checkpoint_name(step)
    loaded, _, info = ck.load_model(run_dir)
    assert info["step"] == step
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert not list(run_dir.glob(".tmp-*"))  # the half-written temp folder is gone too


# ------------------------------------------------------------------------------------------ kill and resume


def test_sigkill_and_resume_ends_bit_identical(tmp_path):
    result = _load_script().run_kill_resume(kills=3, steps=40, seed=0, workdir=tmp_path, log=lambda *a: None)
    assert result["kills"] == 3
    # after every kill that left a checkpoint, `latest` equals the reference's; a kill before the
    # first one has nothing to compare and is counted apart, never as identical (issue 21)
    compared = [c for c in result["cycles"] if c["latest_step"] is not None]
    assert all(c["identical"] is True for c in compared) and len(compared) >= 2
    assert result["cycles_identical"] == len(compared) == 3 - result["cycles_without_checkpoint"]
    assert result["final_step"] == 40 and result["final_identical"]


# ------------------------------------------------------------------------------------------ write failures


def test_full_disk_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = _model()
    _save(tmp_path, model, 1)
    real_save_file = ck.save_file

    def half_then_full(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) // 2)  # what a disk that filled up mid-file leaves
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)

    monkeypatch.setattr(ck, "save_file", half_then_full)
    changed = _model(seed=1)
    with pytest.raises(UserError, match=r"ckpt-00000002: cannot save the checkpoint: the disk is full; .*previous"):
        _save(tmp_path, changed, 2)
    _assert_latest_is(tmp_path, 1, model)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["ckpt-00000001"]


def test_an_exception_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = _model()
    _save(tmp_path, model, 1)
    real_torch_save = torch.save

    def write_some_then_fail(obj, f, *args, **kwargs):
        real_torch_save(obj, f, *args, **kwargs)
        raise RuntimeError("injected failure after the optimizer state was written")

    monkeypatch.setattr(torch, "save", write_some_then_fail)
    with pytest.raises(RuntimeError, match="injected"):  # not a user error: it keeps its traceback
        _save(tmp_path, _model(seed=1), 2)
    monkeypatch.undo()
    _assert_latest_is(tmp_path, 1, model)
    _save(tmp_path, model, 2)  # and the next save works
    _assert_latest_is(tmp_path, 2, model)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 160 KiB tmpfs: a few tiny checkpoints fit, then the disk is full."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here to fill up ({proc.stderr.strip() or 'mount failed'}); "
                    "the patched-writer test covers the full disk instead")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_cli_training_on_a_disk_that_fills_up(tmp_path, tiny_tmpfs):
    """A real full disk (no patching): the run stops with one line saying so; `latest` still loads."""
    corpus = _load_script().write_corpus(tmp_path / "t.txt")
    run = tiny_tmpfs / "run"
    argv = [sys.executable, "-m", "scratchlm", "train", "--preset", "shakespeare-char", "--data", str(corpus),
            "--tokenizer", "char", "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16",
            "--batch_size", "2", "--max_steps", "30", "--checkpoint_interval", "1", "--eval_interval", "0",
            "--eval_iters", "1", "--sample_tokens", "0", "--threads", "1", "--progress", "quiet",
            "--out_dir", str(run), "--data_cache", str(tmp_path / "data")]
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "the disk is full" in lines[0] or "No space left on device" in lines[0], lines[0]
    model, _, info = ck.load_model(run)  # the newest checkpoint that fitted
    assert 1 <= info["step"] < 30
    ck.load_training_state(info["checkpoint"])


# ------------------------------------------------------------------------------------------ untrusted files


class _Marker:
    """Unpickling this opens (creates) the marker file: code that runs when the file is read."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _evil_pickle(path: Path, marker: Path) -> Path:
    torch.save({"state": {0: {"exp_avg": _Marker(marker)}}, "param_groups": []}, path)
    return path


def test_the_marker_pickle_really_runs_code_when_unpickled(tmp_path):
    """The control: unpickled without weights_only, the file does create the marker."""
    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    _evil_pickle(tmp_path / "evil.pt", marker)
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("name", ["optimizer.pt", "trainer_state.pt"])
def test_a_pickle_in_the_training_state_is_refused(tmp_path, name):
    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    ckpt = _save(tmp_path / "run", _model(), 1)
    _evil_pickle(ckpt / name, marker)
    with pytest.raises(UserError, match=rf"{name}: cannot read it \(refused: it holds a pickled \S*open"):
        ck.load_training_state(ckpt)
    assert not marker.exists()


def test_a_pickle_posing_as_weights_is_refused(tmp_path):
    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    ckpt = _save(tmp_path / "run", _model(), 1)
    _evil_pickle(ckpt / "model.safetensors", marker)
    with pytest.raises(UserError, match="model.safetensors: cannot read the weights"):
        ck.load_model(ckpt)
    assert not marker.exists()


def test_a_pickle_in_a_hugging_face_folder_is_refused(tmp_path):
    from scratchlm.hf.interop import import_hf_dir

    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(dict(model_type="gpt2", vocab_size=50, n_positions=16, n_embd=16,
                                                    n_layer=1, n_head=2)))
    torch.save({"transformer.wte.weight": _Marker(marker)}, hf / "pytorch_model.bin")
    with pytest.raises(UserError, match=r"could not read the weights \(refused: it holds a pickled \S*open"):
        import_hf_dir(hf)
    assert not marker.exists()


def test_resume_and_import_from_the_command_line_never_run_the_pickle(tmp_path):
    """The same through `scratchlm train --resume` and `scratchlm import-hf`, as processes."""
    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    ckpt = _save(tmp_path / "run", _model(), 1)
    _evil_pickle(ckpt / "trainer_state.pt", marker)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(dict(model_type="gpt2", vocab_size=50, n_positions=16, n_embd=16,
                                                    n_layer=1, n_head=2)))
    torch.save({"transformer.wte.weight": _Marker(marker)}, hf / "pytorch_model.bin")
    # a train config and data (5 characters, within the model's 37) so that --resume gets as far
    # as reading the training state
    (tmp_path / "ab.txt").write_text("ab ba aab bba\n" * 50)
    cfg = json.loads((ckpt / "config.json").read_text())
    from scratchlm.training.train_config import TrainConfig

    cfg["train"] = TrainConfig(data=str(tmp_path / "ab.txt"), tokenizer="char", data_cache=str(tmp_path / "data"),
                               threads=1, progress="quiet").to_dict()  # complete, as a run saves it
    (ckpt / "config.json").write_text(json.dumps(cfg))
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-m", "scratchlm", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=tmp_path)
             for argv in (["import-hf", str(hf), str(tmp_path / "out")], ["train", "--resume", str(tmp_path / "run")])]
    for proc, where in zip(procs, ["could not read the weights", "trainer_state.pt: cannot read it"]):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
        assert where in err, err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_weights_load_only_from_safetensors(tmp_path, monkeypatch):
    """load_model reads no pickle at all: with every unpickler disabled it still loads, and a
    checkpoint holding its weights only as a pickle is refused."""
    import pickle

    model = _model()
    ckpt = _save(tmp_path / "run", model, 1)

    def forbidden(*args, **kwargs):
        raise AssertionError("load_model unpickled something")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    loaded, _, _ = ck.load_model(tmp_path / "run")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    monkeypatch.undo()
    torch.save(model.state_dict(), ckpt / "pytorch_model.bin")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(UserError, match="model.safetensors: missing weights file"):
        ck.load_model(ckpt)
