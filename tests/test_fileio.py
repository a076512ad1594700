"""scratchlm.fileio.atomic_write, and the writers built on it: whole or not at all, no temporary
file left, the usual permissions."""

from __future__ import annotations

import os
import stat

import pytest

from scratchlm.fileio import atomic_write


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "metrics.jsonl"
    target.write_bytes(b"the user's data\n")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as f:
            f.write(b"half of something")
            raise RuntimeError("the disk filled up")
    assert target.read_bytes() == b"the user's data\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_finished_write_replaces_whole_with_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        target = tmp_path / "out.txt"
        with atomic_write(target, "w", durable=True) as f:
            f.write("naïve text\n")
        assert target.read_text(encoding="utf-8") == "naïve text\n"
        assert _mode(target) == 0o644  # 0666 less the umask, not mkstemp's 0600
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_durable_write_reaches_the_disk_before_its_rename(tmp_path, monkeypatch):
    """durable=True: the temporary file is fsynced, holding every byte written (flushed from
    Python's buffer first), before the rename makes it the file. A crash between the two would
    otherwise leave the name pointing at a file whose data never reached the disk."""
    events = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", st.st_ino, st.st_size))
        real_fsync(fd)

    def moved(real, name):
        def move(src, dst, *args, **kwargs):
            events.append((name, os.stat(src).st_ino))
            return real(src, dst, *args, **kwargs)
        return move

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", moved(real_replace, "rename"))
    monkeypatch.setattr(os, "rename", moved(real_rename, "rename"))
    data = b"a checkpoint's worth of bytes\n" * 100
    with atomic_write(tmp_path / "out.bin", durable=True) as f:
        f.write(data)
    renames = [e for e in events if e[0] == "rename"]
    assert len(renames) == 1, events
    ino = renames[0][1]
    before = events[:events.index(renames[0])]
    assert ("fsync", ino, len(data)) in before, events  # the renamed file, whole, synced before its rename
    assert (tmp_path / "out.bin").read_bytes() == data


def test_pictures_are_written_whole_and_readable_by_others(tmp_path):
    import numpy as np

    from scratchlm.inside.attention_maps import attention_figure, save_figure

    old = os.umask(0o022)
    try:
        out = save_figure(attention_figure([np.full((1, 2, 2), 0.5)], ["a", "b"]), tmp_path / "att.png")
    finally:
        os.umask(old)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and _mode(out) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["att.png"]
