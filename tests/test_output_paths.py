"""Where commands write, and what a failed write leaves (issue 30, items 1, 2 and 8).

- One rule for output folders (scratchlm.outdir): `prepare` writes only into a new or empty folder
  or its own earlier output, never over its input, one writer at a time; the refusals of every
  other command that writes are cases in test_cli_bad_input.py (their files hashed before and after).
- Temporary names are short: a legal 250-character output name is written, not refused as "File
  name too long" about a temporary name.
- Logs that cannot tear: a failed append leaves no half record (an injected failure mid-write),
  and a torn last record is cut at the next resume and said in one line.
- A full disk names the path, and what the stopped run keeps and loses.
- A resume says which settings it changes; a run killed while it started (real SIGKILLs at two
  points of its tokenizer's save) is started again by the same command.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scratchlm import fileio
from scratchlm.data import DataConfig, prepare
from scratchlm.errors import UserError
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.runlock import RunLock
from scratchlm import checkpoint as ck
from helpers import TINY_MODEL, train_tiny_run, tree_hashes, write_text

REPO = Path(__file__).resolve().parents[1]


def _cli(args: list[str], cwd: Path, prelude: str = "") -> subprocess.CompletedProcess:
    """`python -m scratchlm ARGS` as its own process (after `prelude`, Python run first)."""
    code = prelude + "\nimport sys\nfrom scratchlm.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    env = {**os.environ, "SCRATCHLM_CACHE": str(cwd / "cache"), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _one_error_line(proc_or_err) -> str:
    err = proc_or_err if isinstance(proc_or_err, str) else proc_or_err.stderr
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------------------ prepare


def test_a_second_prepare_into_a_folder_being_prepared_is_refused(tmp_path):
    """While one prepare holds --out (its lock, as scratchlm.outdir takes it), a second is
    refused with one line and does not say "prepared"; once the first ends, the next one runs."""
    text = write_text(tmp_path / "t.txt")
    out = tmp_path / "out"
    argv = ["prepare", "--data", str(text), "--tokenizer", "char", "--out", str(out)]
    with RunLock(out, doing="preparing data into this folder", flag="--out"):
        before = tree_hashes(tmp_path)
        proc = _cli(argv, tmp_path)
        assert proc.returncode == 2 and "prepared" not in proc.stdout
        assert f"process {os.getpid()} is preparing data into this folder" in _one_error_line(proc)
        assert tree_hashes(tmp_path) == before
    assert not out.exists()  # the lock made the folder and took it away again: nothing was written
    proc = _cli(argv, tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith(f"prepared {out}"), proc.stderr
    assert (out / ".scratchlm-output").read_text() == "scratchlm prepare\n"


def _waiting_on_flock(lock_file: Path) -> bool:
    """Whether some process or thread waits for a flock on lock_file (Linux: /proc/locks lists a
    waiter as `N: -> FLOCK ... MAJ:MIN:INODE ...`)."""
    inode = os.stat(lock_file).st_ino
    lines = Path("/proc/locks").read_text().splitlines()
    return any("->" in line and "FLOCK" in line and f":{inode} " in line for line in lines)


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks to see a waiter")
def test_training_waits_for_a_prepare_of_its_cache_folder_and_takes_its_output(tmp_path, capsys):
    """ensure_prepared (train's data cache) does not refuse a cache folder another process is
    preparing: it waits for its lock, then takes the finished output instead of building again."""
    import threading
    import time

    from scratchlm.data import ensure_prepared
    from scratchlm.data.preparation import cache_dir

    cfg = DataConfig(data=str(write_text(tmp_path / "t.txt")), tokenizer="char")
    folder = cache_dir(cfg, tmp_path / "cache")
    elsewhere = prepare(cfg, tmp_path / "elsewhere", progress=False)  # what the other writer will have made
    result: list = []
    with RunLock(folder, doing="preparing data into this folder", flag="--out"):
        waiter = threading.Thread(target=lambda: result.append(ensure_prepared(cfg, tmp_path / "cache", progress=False)))
        waiter.start()
        end = time.monotonic() + 120
        while not _waiting_on_flock(folder / ".lock"):  # the thread is blocked on the lock: it did not refuse
            assert waiter.is_alive() and time.monotonic() < end, result
            time.sleep(0.01)
        for p in elsewhere.iterdir():  # the other writer publishes, then lets go
            os.rename(p, folder / p.name)
        inode = os.stat(folder / "train-00000.bin").st_ino
    waiter.join(120)
    assert result == [folder] and os.stat(folder / "train-00000.bin").st_ino == inode  # taken, not built again
    assert capsys.readouterr().err == (f"note: {folder}: process {os.getpid()} is preparing data into this folder; "
                                       "waiting for it to end\n")


def test_training_takes_a_cache_folder_whose_writer_ends_as_it_is_refused(tmp_path, monkeypatch, capsys):
    """The other prepare of train's cache folder ends between this one's failed try at the lock
    and its look at who holds it (it finds nobody): waiting, this one takes the lock and
    the finished output; it is not refused. The ending is made to land exactly there by ending
    the holder inside that look."""
    import scratchlm.outdir as outdir
    from scratchlm.data import ensure_prepared
    from scratchlm.data.preparation import cache_dir

    cfg = DataConfig(data=str(write_text(tmp_path / "t.txt")), tokenizer="char")
    folder = cache_dir(cfg, tmp_path / "cache")
    elsewhere = prepare(cfg, tmp_path / "elsewhere", progress=False)
    other = RunLock(folder, doing="preparing data into this folder", flag="--out").acquire()
    real_holder = outdir.holder_of

    def the_other_ends_now(path):
        for p in elsewhere.iterdir():  # it publishes, then lets go
            os.rename(p, folder / p.name)
        other.release()
        return real_holder(path)

    monkeypatch.setattr(outdir, "holder_of", the_other_ends_now)
    inode = os.stat(elsewhere / "train-00000.bin").st_ino  # a rename keeps it; a new build would not
    assert ensure_prepared(cfg, tmp_path / "cache", progress=False) == folder
    assert os.stat(folder / "train-00000.bin").st_ino == inode and not (folder / ".lock").exists()
    assert capsys.readouterr().err == ""  # nobody to wait for once it looked


def test_trains_data_cache_names_its_own_flag_and_rebuilds_its_own_leftovers(tmp_path):
    """The data cache is scratchlm's: a cache folder holding only names prepare writes, but no
    marker and no complete output (an older version's or a kill's leftover), is built again, not
    refused for good; a cache folder holding another name is refused naming --data_cache (train's
    flag), not prepare's --out."""
    from scratchlm.data import ensure_prepared
    from scratchlm.data.preparation import cache_dir, is_prepared

    cfg = DataConfig(data=str(write_text(tmp_path / "t.txt")), tokenizer="char")
    folder = cache_dir(cfg, tmp_path / "cache")
    folder.mkdir(parents=True)
    (folder / "train.bin").write_bytes(b"\0" * 10)  # torn, unmarked: an older version's name
    (folder / "train-00003.bin").write_bytes(b"\0" * 10)  # and a shard's
    assert ensure_prepared(cfg, tmp_path / "cache", progress=False) == folder and is_prepared(folder)
    assert sorted(p.name for p in folder.glob("*.bin")) == ["train-00000.bin", "val-00000.bin"]
    (folder / "notes.txt").write_text("mine")
    (folder / "meta.json").unlink()  # incomplete again, and now with a name prepare never writes
    before = tree_hashes(tmp_path)
    with pytest.raises(UserError) as refused:
        ensure_prepared(cfg, tmp_path / "cache", progress=False)
    assert "notes.txt" in str(refused.value) and str(refused.value).endswith("choose another --data_cache")
    assert "--out" not in str(refused.value) and tree_hashes(tmp_path) == before


@pytest.mark.parametrize("out, how, named", [("tok", "is", "tok"), ("tok/sub", "lies in", "tok"), (".", "holds", "t.txt")])
def test_prepare_never_writes_into_or_around_its_input_folder(tmp_path, out, how, named):
    """One check (outdir.check_not_input) for every output, file or folder: prepare's --out may
    not be its --tokenizer_file folder, lie inside it (it was let through: prepare wrote into the
    user's tokenizer folder) or hold it."""
    from scratchlm.text.tokenizer import CharTokenizer

    tok = tmp_path / "tok"
    CharTokenizer("abcdefghijklmnopqrstuvwxyz ").save(tok)
    cfg = DataConfig(data=str(write_text(tmp_path / "t.txt")), tokenizer="char", tokenizer_file=str(tok))
    before = tree_hashes(tmp_path)
    with pytest.raises(UserError) as refused:
        prepare(cfg, tmp_path / out, progress=False)
    assert str(refused.value) == (f"--out {tmp_path / out}: {how} this command's own input ({(tmp_path / named).resolve()}); "
                                  "write the output to another --out")
    assert tree_hashes(tmp_path) == before


def _fail_after_writing(code: int):
    """A stand-in for ShardWriter.write (every shard's ids go through it) that writes the ids, so
    the staging folder holds a partial shard, and then fails as a write does with errno `code`."""
    from scratchlm.data.writing import ShardWriter

    real_write = ShardWriter.write

    def write_then_fail(self, ids, nbytes=None):
        real_write(self, ids, nbytes)
        raise OSError(code, os.strerror(code))

    return write_then_fail


def test_prepare_on_a_full_disk_names_the_folder_and_changes_nothing(tmp_path, monkeypatch):
    from scratchlm.data.writing import ShardWriter

    cfg = DataConfig(data=str(write_text(tmp_path / "t.txt")), tokenizer="char")
    out = prepare(cfg, tmp_path / "out", progress=False)
    before = tree_hashes(tmp_path)
    monkeypatch.setattr(ShardWriter, "write", _fail_after_writing(errno.ENOSPC))
    for target in (out, tmp_path / "new"):
        with pytest.raises(UserError) as caught:
            prepare(cfg, target, progress=False)
        message = str(caught.value)
        assert message.startswith(f"{target}: no room to write the prepared data: the disk is full; ")
        assert f"nothing in {target} was changed" in message
        assert tree_hashes(tmp_path) == before  # the earlier output whole; the new folder not left behind


@pytest.mark.parametrize("code, said", [
    (errno.ENOSPC, "the disk is full"),
    (errno.EDQUOT, "the disk quota is used up"),
    (errno.EFBIG, "the file grew past the largest one the file system or its limits allow"),
    (errno.EACCES, "the write failed (Permission denied)"),
])
def test_every_writer_says_a_failed_write_in_the_same_words(tmp_path, monkeypatch, code, said):
    """One wording of a failed write (scratchlm.fileio.why_write_failed) for prepare, a run's
    tokenizer, the run's log and checkpoints: a used-up quota or a file over the size limit is
    said as lack of room everywhere (the log said the system's words for them)."""
    from scratchlm.data.writing import ShardWriter
    from scratchlm.training.run_folder import save_run_tokenizer
    from scratchlm.text.tokenizer import CharTokenizer

    def failing(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    assert fileio.why_write_failed(OSError(code, os.strerror(code))) == said
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(ck, "save_tokenizer", failing)
    with pytest.raises(UserError, match=f"cannot save the run's tokenizer: {re.escape(said)}; no step"):
        save_run_tokenizer(CharTokenizer("ab"), tmp_path / "run")
    with pytest.raises(UserError, match=f"cannot save the checkpoint: {re.escape(said)}; nothing was replaced"):
        raise ck._write_failed(tmp_path / "ckpt", OSError(code, os.strerror(code)))
    cfg = DataConfig(data=str(write_text(tmp_path / "t.txt")), tokenizer="char")
    monkeypatch.setattr(ShardWriter, "write", _fail_after_writing(code))
    if code == errno.EACCES:  # not lack of room: the system's own error goes on (the CLI words it)
        with pytest.raises(PermissionError):
            prepare(cfg, tmp_path / "out", progress=False)
    else:
        with pytest.raises(UserError, match=f"no room to write the prepared data: {re.escape(said)}; nothing in"):
            prepare(cfg, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "t.txt"] and not any((tmp_path / "run").iterdir())


def test_export_hf_stages_its_folder_by_the_one_temporary_name_scheme(tmp_path, monkeypatch):
    """export-hf writes its folder beside its place under the name every staged folder has
    (`.tmp-NAME-` and 8 hex digits, as checkpoints and tokenizers are staged), fsynced and renamed
    by the same code, not a hand-made copy with a name of its own."""
    import safetensors.torch

    from scratchlm.hf.interop import export_hf

    staged: list[str] = []
    real_save = safetensors.torch.save_file

    def save_and_look(tensors, path, *args, **kwargs):
        staged.append(Path(path).parent.name)
        return real_save(tensors, path, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", save_and_look)
    export_hf(GPT(GPTConfig(vocab_size=40, **TINY_MODEL)), tmp_path / "out", None)
    assert len(staged) == 1 and re.fullmatch(r"\.tmp-out-[0-9a-f]{8}", staged[0]), staged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_250_character_output_name_is_written(tmp_path):
    """A file name may hold 255 bytes; the temporary names beside an output are short, so a legal
    250-character name works for prepare (a process), the atomic file writer, export-hf and
    import-hf's checkpoint writer."""
    text = write_text(tmp_path / "t.txt")
    name = "n" * 250
    proc = _cli(["prepare", "--data", str(text), "--tokenizer", "char", "--out", name], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / name / "meta.json").is_file()
    with fileio.atomic_write(tmp_path / ("p" * 246 + ".png")) as f:
        f.write(b"picture")
    assert (tmp_path / ("p" * 246 + ".png")).read_bytes() == b"picture"
    from scratchlm.hf.interop import export_hf

    model = GPT(GPTConfig(vocab_size=40, **TINY_MODEL))
    ck.save_model_checkpoint(model, None, tmp_path / ("c" * 250))
    export_hf(model, tmp_path / ("e" * 250), None)
    assert (tmp_path / ("c" * 250) / "model.safetensors").is_file()
    assert (tmp_path / ("e" * 250) / "config.json").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("writer", ["import-hf", "export-hf"])
def test_a_folder_another_writer_filled_meanwhile_is_left_whole(tmp_path, monkeypatch, writer):
    """Two writers of one new folder: the one that finishes second is refused in one line, and
    the other's output is left exactly as it was (no swap that would move it aside)."""
    import safetensors.torch

    from scratchlm.hf.interop import export_hf

    out = tmp_path / "out"
    real_save = safetensors.torch.save_file

    def save_while_another_finishes(*args, **kwargs):
        real_save(*args, **kwargs)
        out.mkdir()
        (out / "theirs.txt").write_text("the other writer's output")

    monkeypatch.setattr(safetensors.torch, "save_file", save_while_another_finishes)
    monkeypatch.setattr(ck, "save_file", save_while_another_finishes)
    model = GPT(GPTConfig(vocab_size=40, **TINY_MODEL))
    with pytest.raises(UserError) as refused:
        if writer == "import-hf":
            ck.save_model_checkpoint(model, None, out)
        else:
            export_hf(model, out, None)
    assert str(refused.value) == (f"{out}: another process wrote this folder while this one was writing it; what it "
                                  "wrote was left whole, and nothing of this command's was kept. Choose a new folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]


def test_a_full_disk_while_a_model_folder_is_written_names_it_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    """import-hf's checkpoint writer and export-hf: safetensors reports a full disk in its own
    words (not an OSError), which was a traceback; now one line naming the output folder."""
    import safetensors.torch
    from safetensors import SafetensorError

    from scratchlm.cli.main import main

    model = GPT(GPTConfig(vocab_size=40, **TINY_MODEL))
    source = ck.save_model_checkpoint(model, None, tmp_path / "ckpt")
    before = tree_hashes(tmp_path)

    def full_disk(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    monkeypatch.setattr(ck, "save_file", full_disk)
    with pytest.raises(UserError) as caught:
        ck.save_model_checkpoint(model, None, tmp_path / "imported")
    assert str(caught.value) == (f"{tmp_path / 'imported'}: cannot write the checkpoint: the disk is full; nothing of it "
                                 "was left behind. Free some space (or fix the folder) and run the command again")
    assert main(["export-hf", str(source), str(tmp_path / "hf")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {tmp_path / 'hf'}: cannot write the Hugging Face folder: the disk is full; nothing")
    assert tree_hashes(tmp_path) == before


# ------------------------------------------------------------------------------------------ torn logs


class _DiskFullsMidWrite:
    """A stand-in for the `os` module inside scratchlm.fileio: a write whose bytes hold `marker`
    writes half of them, and the next write fails as a full disk does."""

    def __init__(self, marker: bytes):
        self.marker, self.failing = marker, False

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        if self.failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.marker in bytes(data):
            self.failing = True
            return os.write(fd, bytes(data)[: len(data) // 2])
        return os.write(fd, data)


def test_an_append_that_fails_mid_write_leaves_no_half_record(tmp_path, monkeypatch):
    log = tmp_path / "metrics.jsonl"
    fileio.append_line(log, '{"step": 1}')
    monkeypatch.setattr(fileio, "os", _DiskFullsMidWrite(b'"step": 2'))
    with pytest.raises(OSError) as caught:
        fileio.append_line(log, '{"step": 2, "loss": 3.25}')
    assert caught.value.errno == errno.ENOSPC
    assert log.read_bytes() == b'{"step": 1}\n'


@pytest.mark.parametrize("content, kept", [
    (b'{"a": 1}\n{"b": 2}\n', b'{"a": 1}\n{"b": 2}\n'),  # whole: nothing cut
    (b'{"a": 1}\n{"b": 2, "c', b'{"a": 1}\n'),  # torn mid-record
    (b'{"a": 1}\n{"b": 2}', b'{"a": 1}\n{"b": 2}\n'),  # only the newline lost: the record kept, the newline added
    (b'{"a": 1}\n12', b'{"a": 1}\n'),  # JSON, but not a record: `12` may be `123` torn
    (b'{"a": 1}\n{"b": "\xc3', b'{"a": 1}\n'),  # torn inside a UTF-8 character
    # a last line that ends in a newline is checked too: a crash of the machine can leave a log
    # grown over bytes never written (zeros), and an editor gives a torn line its newline
    (b'{"a": 1}\n\x00\x00\x00\x00\n', b'{"a": 1}\n'),
    (b'{"a": 1}\n{"b": 2, "c\n', b'{"a": 1}\n'),
    (b'{"a": 1}\n12\n', b'{"a": 1}\n'),
    (b'{"a', b''),  # the only record torn
    (b'', b''),
    (b'{"a": 1}\n\n', b'{"a": 1}\n\n'),  # a blank last line is no record, so no torn one: nothing cut or said
    (b'{"a": 1}\n\n\n', b'{"a": 1}\n\n\n'),
    (b'{"a": 1}\n \t', b'{"a": 1}\n \t'),
    (b'\n', b'\n'),
    (b'{"a": 1}\n' * 20000 + b'{"z', b'{"a": 1}\n' * 20000),  # a log longer than one read of its tail
    (b'{"a": 1}\n' * 20000 + b'{"z\n', b'{"a": 1}\n' * 20000),
], ids=lambda content: f"{len(content)}B-" + content[-12:].decode("ascii", "backslashreplace"))
def test_a_torn_last_record_is_cut_by_hand(tmp_path, content, kept):
    log = tmp_path / "metrics.jsonl"
    log.write_bytes(content)
    cut = fileio.cut_torn_tail(log)
    assert log.read_bytes() == kept
    assert cut == max(0, len(content) - len(kept))


@pytest.fixture
def tiny_run(tmp_path, monkeypatch, one_torch_thread) -> Path:
    """The 4-step tiny run of helpers.train_tiny_run (checkpoints at steps 2 and 4, lr 0.003)."""
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path / "cache"))
    return train_tiny_run(tmp_path, tmp_path / "run")


def _records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]  # every line whole


def test_resume_cuts_a_torn_log_and_says_so(tiny_run, capsys):
    from scratchlm.cli.main import main

    log = tiny_run / "metrics.jsonl"
    whole = log.read_bytes()
    torn = b'{"event": "train", "step": 5, "lo'  # what a full disk left of a record
    log.write_bytes(whole + torn)
    assert main(["train", "--resume", str(tiny_run), "--max_steps", "5", "--progress", "quiet"]) == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"note: {log}: cut a torn last record ({len(torn)} bytes, from a write that "
                                        "did not finish); the records before it are kept"]
    assert log.read_bytes().startswith(whole)
    assert [r["event"] for r in _records(log)[len(whole.splitlines()):]][:1] == ["resume"]


def test_a_full_disk_while_the_log_is_appended_says_what_is_kept_and_lost(tiny_run, capsys, monkeypatch):
    from scratchlm.cli.main import main

    log = tiny_run / "metrics.jsonl"
    monkeypatch.setattr(fileio, "os", _DiskFullsMidWrite(b'"event": "train", "step": 6,'))
    code = main(["train", "--resume", str(tiny_run), "--max_steps", "8", "--progress", "quiet"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2
    assert line.startswith(f"error: {log}: cannot append to the run's log: the disk is full. ")
    assert f"kept: {tiny_run / 'ckpt-00000004'} (step 4); lost: steps 5-6" in line
    assert f"scratchlm train --resume {tiny_run}" in line
    assert _records(log)[-1]["step"] == 5  # the half record was cut back off; step 5's record is the last


def test_a_full_disk_at_a_checkpoint_says_what_is_kept_and_lost(tiny_run, capsys, monkeypatch):
    from scratchlm.cli.main import main

    real = ck._write_weights

    def full_at_step_6(state, config, path):
        if "ckpt-00000006" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(state, config, path)

    monkeypatch.setattr(ck, "_write_weights", full_at_step_6)
    code = main(["train", "--resume", str(tiny_run), "--max_steps", "8", "--progress", "quiet"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith(f"error: {tiny_run / 'ckpt-00000006'}: cannot save the checkpoint: the disk is full")
    assert f"kept: {tiny_run / 'ckpt-00000004'} (step 4); lost: steps 5-6" in line
    assert (tiny_run / "latest").read_text() == "ckpt-00000004\n"


# ------------------------------------------------------------------------------------------ resume


def test_resume_names_each_changed_setting(tiny_run, capsys):
    from scratchlm.cli.main import main

    assert main(["train", "--resume", str(tiny_run), "--max_steps", "5", "--lr", "0.1", "--progress", "lines"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "changed settings" in line]
    assert said == ["resuming with changed settings: max_steps 4 \u2192 5, lr 0.003 \u2192 0.1"]
    resumed = [r for r in _records(tiny_run / "metrics.jsonl") if r["event"] == "resume"]
    assert resumed[-1]["changed"] == {"max_steps": [4, 5], "lr": [0.003, 0.1]}


def _new_run_argv(base: Path, run: Path) -> list[str]:
    """A 2-step run of a tiny model on a small text, written to `run` (its data cache in base/data)."""
    write_text(base / "t.txt")
    return ["train", "--preset", "shakespeare-char", "--data", str(base / "t.txt"), "--tokenizer", "char",
            "--max_steps", "2", "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--block_size", "8",
            "--batch_size", "2", "--threads", "1", "--progress", "quiet", "--eval_iters", "1",
            "--data_cache", str(base / "data"), "--out_dir", str(run)]


def test_a_full_disk_while_a_run_saves_its_tokenizer_names_it_and_leaves_nothing(tmp_path, monkeypatch, capsys,
                                                                                 one_torch_thread):
    from scratchlm.cli.main import main

    run = tmp_path / "runs" / "run"
    (tmp_path / "runs").mkdir()
    argv = _new_run_argv(tmp_path, run)
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path / "cache"))

    def full_disk(tokenizer, directory):  # as a write inside save_tokenizer's temporary folder fails
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(directory) / ".tmp-tokenizer-0a1b/chars.json"))

    monkeypatch.setattr(ck, "save_tokenizer", full_disk)
    assert main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == (f"error: {run / 'tokenizer'}: cannot save the run's tokenizer: the disk is full; no step "
                    "was trained yet, so nothing is lost: free some space (or fix the folder) and run the same "
                    "command again")
    assert list((tmp_path / "runs").iterdir()) == []  # the run folder the start made is gone again


# kill the process at one point of save_tokenizer, as a kill -9 from outside would
_KILL_IN_TOKENIZER_SAVE = """
import os, signal
from pathlib import Path
import scratchlm.checkpoint as ck
real = ck._fsync_path
def fsync_then_die(path):
    real(path)
    if {where}:
        os.kill(os.getpid(), signal.SIGKILL)
ck._fsync_path = fsync_then_die
"""


@pytest.mark.slow
@pytest.mark.parametrize("where, left", [
    ('".tmp-tokenizer-" in str(path)', ".tmp-tokenizer-"),  # files staged, not yet renamed
    ('(Path(path) / "tokenizer").is_dir()', "tokenizer"),  # renamed into place, before the first step
])
def test_a_run_killed_while_saving_its_tokenizer_is_started_again_by_the_same_command(tmp_path, monkeypatch,
                                                                                       capsys, where, left):
    from scratchlm.cli.main import main

    run = tmp_path / "run"
    argv = _new_run_argv(tmp_path, run)
    proc = _cli(argv, tmp_path, prelude=_KILL_IN_TOKENIZER_SAVE.format(where=where))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    names = sorted(p.name for p in run.iterdir())
    assert ".lock" in names and any(n.startswith(left) for n in names) and "metrics.jsonl" not in names, names
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path / "cache"))
    before = tree_hashes(tmp_path)
    assert main(["train", "--resume", str(run)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "killed while it started" in line and f"--out_dir {run}" in line
    assert tree_hashes(tmp_path) == before
    assert main(argv) == 0  # the same command again
    err = capsys.readouterr().err
    assert f"note: {run}: a run killed while it started left its tokenizer there" in err
    assert sorted(p.name for p in run.iterdir()) == ["ckpt-00000002", "latest", "metrics.jsonl", "tokenizer"]
    _, tokenizer, info = ck.load_model(run)
    assert info["step"] == 2 and tokenizer.chars == sorted(set((tmp_path / "t.txt").read_text(encoding="utf-8")))
