"""One writer per run folder (scratchlm.runlock), readers without a lock.

Real `python -m scratchlm train` processes: a second writer is refused with one line naming the
first one's PID; a writer killed with SIGKILL leaves no lock that blocks the next one; and a
reader that loads `latest` and generates inside each of 6 checkpoint saves (the writer paused
between writing the new checkpoint and renaming it into place) always finds a whole checkpoint,
whose text equals what that checkpoint gives when loaded afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scratchlm.errors import UserError
from scratchlm.runlock import LOCK_FILE, RunLock, holder

from helpers import train_tiny_run


def _resume(run: Path, cache: Path, max_steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scratchlm", "train", "--resume", str(run), "--max_steps", str(max_steps),
            "--checkpoint_interval", "1", "--data_cache", str(cache), *extra]


def _env(base: Path) -> dict:
    return {**os.environ, "SCRATCHLM_CACHE": str(base / "cache")}


def _wait_for(condition, seconds: float = 120.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_the_lock_is_exclusive_and_dies_with_its_holder(tmp_path):
    """In-process: a second RunLock on the same folder is refused naming this PID; releasing
    removes the lock file and the folder it made; a holder that died leaves a file that no
    longer blocks."""
    run = tmp_path / "a" / "run"
    first = RunLock(run).acquire()
    assert (run / LOCK_FILE).read_text() == f"{os.getpid()}\ntraining in this run folder\n"
    assert holder(run) == os.getpid()
    with pytest.raises(UserError, match=f"process {os.getpid()} is training"):
        RunLock(run).acquire()
    first.release()
    assert not run.exists() and not (tmp_path / "a").exists()  # nothing was written: the folders go too
    # a holder killed with SIGKILL: its lock file stays, unlocked
    code = f"import os; from scratchlm.runlock import RunLock; RunLock({str(run)!r}).acquire(); os.kill(os.getpid(), 9)"
    subprocess.run([sys.executable, "-c", code], check=False)
    assert (run / LOCK_FILE).is_file() and holder(run) is None
    with RunLock(run):
        assert holder(run) == os.getpid()


@pytest.mark.slow
def test_a_second_writer_is_refused_and_a_killed_one_blocks_nobody(tmp_path):
    base = tmp_path
    run = train_tiny_run(base, base / "run")
    env = _env(base)
    first = subprocess.Popen(_resume(run, base / "data", 100000, "--progress", "lines", "--threads", "1"), env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: holder(run) == first.pid)
        before = sorted(p.name for p in run.iterdir())
        second = subprocess.run(_resume(run, base / "data", 100000), env=env, capture_output=True, text=True, timeout=240)
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert lines[0].startswith("error: ") and f"process {first.pid} is training" in lines[0]
        fresh = subprocess.run([sys.executable, "-m", "scratchlm", "train", "--out_dir", str(run), "--data",
                                str(base / "text.txt"), "--tokenizer", "char"], env=env, capture_output=True, text=True,
                               timeout=240)
        assert fresh.returncode == 2 and f"process {first.pid} is training" in fresh.stderr, fresh.stderr
        assert set(before) <= {p.name for p in run.iterdir()}  # the refused ones removed nothing
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (run / LOCK_FILE).is_file() and holder(run) is None  # the file stays; the lock died with the process
    step = int((run / "latest").read_text().split("-")[1])
    again = subprocess.run(_resume(run, base / "data", step + 2), env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr
    assert (run / "latest").read_text().strip() == f"ckpt-{step + 2:08d}"
    assert not (run / LOCK_FILE).exists()  # released on a clean end


# The writer pauses inside each checkpoint save, at its most fragile instant (every file of the
# new checkpoint written into its temporary folder, nothing renamed yet), says so with a file, and
# goes on when the reader has read: a handshake, so the test sees a read inside every save however
# fast or slow the machine is (it waited on timing before, and could see too few).
_PAUSE_INSIDE_EACH_SAVE = """
import os, time
from pathlib import Path
import scratchlm.checkpoint as ck
real = ck._fsync_path
def fsync_and_wait(path):
    real(path)
    path = Path(path)
    if path.name.startswith(".tmp-ckpt-"):
        step = int(path.name.split("-")[2])
        (path.parent.parent / f"paused-{{step}}").touch()
        go, end = path.parent.parent / f"go-{{step}}", time.monotonic() + {wait}
        while not go.exists() and time.monotonic() < end:
            time.sleep(0.01)
ck._fsync_path = fsync_and_wait
import sys
from scratchlm.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_reader_generating_from_latest_during_each_save_always_finds_a_whole_checkpoint(tmp_path):
    import torch

    from scratchlm.checkpoint import load_model
    from scratchlm.generation.generate import generate

    base = tmp_path
    run = train_tiny_run(base, base / "run")
    start = int((run / "latest").read_text().split("-")[1])
    steps = 6
    argv = _resume(run, base / "data", start + steps, "--threads", "1", "--progress", "quiet")[3:]  # after -m scratchlm
    writer = subprocess.Popen([sys.executable, "-c", _PAUSE_INSIDE_EACH_SAVE.format(wait=240), *argv], env=_env(base),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    torch.set_num_threads(1)
    seen: list[tuple[Path, str]] = []
    try:
        for step in range(start + 1, start + steps + 1):
            _wait_for(lambda: (base / f"paused-{step}").exists() or writer.poll() is not None, 240)
            assert writer.poll() is None, writer.communicate()[1]
            assert any(run.glob(f".tmp-ckpt-{step:08d}-*"))  # the new checkpoint is half-way into place
            model, tokenizer, info = load_model(run)  # `latest`, whatever it names now: the one before
            assert info["checkpoint"].name == f"ckpt-{step - 1:08d}"
            seen.append((info["checkpoint"], generate(model, tokenizer, "the", max_new_tokens=12, greedy=True).text))
            (base / f"go-{step}").touch()
    finally:
        for step in range(start + 1, start + steps + 1):  # never leave the writer waiting
            (base / f"go-{step}").touch()
        _, err = writer.communicate(timeout=240)
    assert writer.returncode == 0, err
    assert (run / "latest").read_text().strip() == f"ckpt-{start + steps:08d}"
    assert len({ckpt.name for ckpt, _ in seen}) == steps
    for ckpt, text in seen:  # each checkpoint read while training wrote, loaded again now
        model, tokenizer, _ = load_model(ckpt)
        assert generate(model, tokenizer, "the", max_new_tokens=12, greedy=True).text == text, ckpt.name


def test_a_read_only_run_folder_is_refused_before_training(tmp_path):
    """Resuming a run on a read-only file system: one line before any step (the lock is the
    first write), not a failure at the first save after the work. Root ignores chmod, so the
    run sits on a small tmpfs remounted read-only (skipped where mounting is not allowed)."""
    import shutil

    base = tmp_path
    run = train_tiny_run(base, base / "run")
    mnt = base / "ro"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or 'mount failed'})")
    try:
        shutil.copytree(run, mnt / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        out = subprocess.run(_resume(mnt / "run", base / "data", 8), env=_env(base), capture_output=True, text=True,
                             timeout=240)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert "cannot write in the folder" in lines[0] and "Read-only file system" in lines[0]
        assert "step" not in lines[0]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_lock_file_removed_while_it_is_read_means_nobody_holds_the_folder(tmp_path, monkeypatch):
    """The holder removes RUN/.lock as it ends; a reader that saw the file a moment before and
    opens it after gets None (nobody trains there), not a FileNotFoundError traceback (the
    playground's Training tab, the run folder checks). The removal is made to land exactly
    between the two by removing the file inside the reader's open."""
    import scratchlm.runlock as runlock

    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text("123\n")
    real_open = os.open

    def open_after_the_holder_ended(path, *args):
        if Path(path).name == LOCK_FILE:
            Path(path).unlink(missing_ok=True)
        return real_open(path, *args)

    monkeypatch.setattr(runlock.os, "open", open_after_the_holder_ended)
    assert holder(run) is None
    assert holder(tmp_path / "no-such-run") is None


def test_a_refusal_says_what_the_holder_does_in_the_holders_own_words(tmp_path):
    """The holder writes what it does into the lock file; a refused process repeats that, not
    its own guess: a `prepare` holding a folder is not called "training" by train's checks."""
    from scratchlm.training.run_folder import _check_fresh_run_dir

    run = tmp_path / "run"
    code = (f"import sys; from scratchlm.runlock import RunLock; RunLock({str(run)!r}, doing='preparing data into "
            "this folder', flag='--out').acquire(); print('held', flush=True); sys.stdin.read()")
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "held\n"
        said = f"process {other.pid} is preparing data into this folder"
        with pytest.raises(UserError) as refused:
            _check_fresh_run_dir(run)  # `train --out_dir RUN`
        assert said in str(refused.value) and "training" not in str(refused.value)
        with pytest.raises(UserError) as refused:
            RunLock(run).acquire()  # a train's lock, whose own `doing` is training
        assert said in str(refused.value) and "training" not in str(refused.value)
    finally:
        other.stdin.close()
        other.wait(60)


def test_a_holder_that_did_not_say_what_it_does_is_named_neutrally(tmp_path):
    """A lock file that holds only a PID (as an older version wrote it) gives "process N holds
    this folder", not a guess at what it does."""
    import fcntl

    from scratchlm.runlock import holder_of

    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text("4242\n")
    fd = os.open(run / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: refused like another process
        with pytest.raises(UserError, match=r": process 4242 holds this folder; wait for it") as refused:
            RunLock(run, doing="preparing data into this folder").acquire()
        assert "preparing" not in str(refused.value)
        assert str(holder_of(run)) == "process 4242 holds this folder"
    finally:
        os.close(fd)
