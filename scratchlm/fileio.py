"""Files: where scratchlm keeps its own (the cache folder), and how it writes anyone's (whole or
not at all). Nothing here imports the rest of the package, so every module may import it."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def cache_home() -> Path:
    """scratchlm's cache folder: $SCRATCHLM_CACHE, else ~/.cache/scratchlm. Prepared data goes in
    its data/ (scratchlm.data.cache_root), the compiled kernels (decoding and training) in kernels/
    unless $SCRATCHLM_KERNEL_CACHE names another folder."""
    env = os.environ.get("SCRATCHLM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "scratchlm"


def file_record(path: str | os.PathLike) -> dict:
    """What a data file is, for a run's record: its resolved path, size in bytes and sha256
    (read in 4 MB blocks); two files with the same bytes are the same data wherever they lie."""
    import hashlib

    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return {"path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def umask() -> int:
    """The process's file-creation mask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


TEMP_STEM_CHARS = 32
"""How much of a name a temporary name beside it repeats (see temp_stem)."""


def temp_stem(name: str) -> str:
    """The part of `name` a temporary file or folder beside it is named after: its first
    TEMP_STEM_CHARS characters. A file name may hold 255 bytes; a legal 250-character name with
    a dot, a random part and `.tmp` added would not fit, and the error would name the temporary
    file, not the user's."""
    return name[:TEMP_STEM_CHARS]


_NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file grew past the largest one the file system or its limits allow",
}


def out_of_room(exc: BaseException) -> bool:
    """Whether a failed write failed for lack of room: a full disk, a used-up quota, a file over
    the largest size allowed (safetensors reports a full disk in its own words, not an OSError)."""
    return getattr(exc, "errno", None) in _NO_ROOM or "StorageFull" in str(exc) or "code: 28" in str(exc)


def why_write_failed(exc: BaseException) -> str:
    """A failed write in a few words, for the one-line errors of every command that writes: lack
    of room said plainly (which kind), anything else as the system words it."""
    if out_of_room(exc):
        return _NO_ROOM.get(getattr(exc, "errno", None), _NO_ROOM[errno.ENOSPC])
    return f"the write failed ({getattr(exc, 'strerror', None) or exc})"


STAGED_PREFIX = ".tmp-"
"""How a folder staged beside its final place begins: `.tmp-NAME-XXXXXXXX` (staged_name), what a
kill before its rename leaves (scratchlm.checkpoint writes them, others find them by this)."""
ASIDE_PREFIX = ".old-"
"""How a folder moved aside to be replaced begins: `.old-NAME-XXXXXXXX`, removed after the swap."""
ATOMIC_SUFFIX = ".tmp"
"""How atomic_write's temporary file ends; it begins with atomic_prefix(NAME)."""


def staged_name(name: str, prefix: str = STAGED_PREFIX) -> str:
    """A new temporary name for a folder beside `name` (STAGED_PREFIX, or ASIDE_PREFIX)."""
    return f"{prefix}{temp_stem(name)}-{uuid.uuid4().hex[:8]}"


def atomic_prefix(name: str) -> str:
    """How atomic_write's temporary file for `name` begins (`.NAME.`, then random, then .tmp)."""
    return f".{temp_stem(name)}."


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", *, durable: bool = False) -> Iterator[IO]:
    """open(path, mode) whose content appears under `path` only once the block ends without an
    exception: it is written to a temporary file beside `path`, which then replaces it in one
    rename, so a reader sees the old file or the new one, never a mix, and a failure (or a
    kill) leaves `path` as it was and no temporary file behind (a kill -9 can leave one, named
    `.NAME.*.tmp`). durable=True also flushes the data to the disk before the rename. The new
    file gets the usual permissions (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=atomic_prefix(path.name), suffix=ATOMIC_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, durable: bool = False) -> Iterator[Path]:
    """atomic_write for a library that opens its output by name: yields the name of an empty
    temporary file beside `path` to write, which replaces `path` in one rename once the block
    ends without an exception (after reaching the disk, with durable=True); on a failure `path`
    stays as it was and the temporary file is removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=atomic_prefix(path.name), suffix=ATOMIC_SUFFIX, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append `line` and a newline to a log of one record per line, whole or not at all: a write
    that fails part-way (a full disk, an interrupt) is cut back off, so the log never ends in half
    a record that the next record would be glued to. One writer at a time (a run holds its lock)."""
    data = (line + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            done = 0
            while done < len(data):  # a write may take only part; the rest follows, or fails
                done += os.write(fd, data[done:])
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)  # shrinking needs no space, so it works on a full disk
            raise
    finally:
        os.close(fd)


def cut_torn_tail(path: str | os.PathLike) -> int:
    """Cut a torn last record off a log of one JSON object per line (append_line's format): a last
    line that is not JSON is what a write that did not finish leaves (a full disk, a kill, a crash
    of the machine); a whole record that lacks only its newline gets it back. A blank last line
    is no record (a record never begins with white space), so it is no torn one: left as it is. Returns the bytes
    cut (0: none, or no log). Only the last line is read, so a long log costs nothing."""
    import json

    try:
        f = open(path, "rb+")
    except FileNotFoundError:
        return 0
    with f:
        size = f.seek(0, os.SEEK_END)
        tail, pos, cut = b"", size, -1
        while pos > 0 and cut == -1:  # back to the newline before the last line
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
            cut = tail.rfind(b"\n", 0, len(tail) - 1)
        start = pos + cut + 1  # where the last line begins (0 when it is the only one)
        last = tail[cut + 1:]
        if not last.strip():  # no last line, or a blank one: no record, so none torn (readers skip blanks)
            return 0
        f.seek(size)
        try:
            whole = isinstance(json.loads(last.decode("utf-8")), dict)  # a record; `12` may be `123` torn
        except ValueError:  # UnicodeDecodeError is one too
            whole = False
        if not whole:
            f.truncate(start)
            return size - start
        if not last.endswith(b"\n"):  # a whole record that lost only its newline keeps it
            f.write(b"\n")
        return 0
