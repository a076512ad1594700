"""One writer per run folder.

`scratchlm train` holds an exclusive lock on RUN/.lock (flock) from before it writes anything in
the run folder until it ends. The operating system drops the lock when the process ends, however
it ends, so a `kill -9` never leaves a stale lock behind: the next writer simply takes it. A
second writer is refused with one line naming the holder's PID (written into the file). Readers
(`generate`, `plot`, `inspect`) never take it: a checkpoint appears whole or not at all, and
`latest` changes in one rename, so a reader needs no lock to see a consistent run.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import NamedTuple

from scratchlm.errors import UserError

LOCK_FILE = ".lock"

try:
    import fcntl
except ImportError:  # Windows: no flock; a run folder there is not protected
    fcntl = None


class FolderBusy(UserError):
    """Another process holds the folder's lock (the refusal of RunLock.acquire without `wait`)."""


class RunLock:
    """The lock of one run folder (see the module's docstring). `acquire` makes the folder when it
    does not exist yet; `release` (on a clean end, or an error) removes the lock file, and the
    folders `acquire` made if nothing else was written in them, so a run that failed to start
    leaves nothing behind."""

    def __init__(self, run_dir: Path | str, *, doing: str = "training in this run folder", flag: str = "--out_dir"):
        """`doing`: what this process does in the folder, written into the lock file for the
        refusals of others (other commands that write a folder lock it too: `prepare`); `flag`:
        the flag that chose the folder, for this process's own errors."""
        self.run_dir = Path(run_dir)
        self.doing, self.flag = doing, flag
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        self._made: list[Path] = []  # folders acquire created, deepest last

    def acquire(self, wait: bool = False) -> "RunLock":
        """Take the lock (see the class); `wait`: wait for a holder to end instead of refusing."""
        missing = [p for p in (self.run_dir, *self.run_dir.parents) if not p.exists()]
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{self.run_dir}: cannot write this folder ({exc.strerror or exc}); "
                            f"choose another {self.flag}") from None
        self._made = list(reversed(missing))
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                self._remove_made()
                raise UserError(f"{self.run_dir}: cannot write in the folder ({exc.strerror or exc}); "
                                "nothing could be saved there. Fix the folder's permissions or "
                                f"choose another {self.flag}") from None
            if fcntl is None:
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                held = _read_holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                    raise
                raise FolderBusy(f"{self.run_dir}: {held or 'another process holds this folder'}; wait for it to "
                                 f"end (or stop it) before writing here again") from None
            # the holder before us may have removed the file between our open and our lock:
            # then we hold a lock on a file nobody else can find, so take the new one instead
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{self.doing}\n".encode())  # for the refusals of others (Holder)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still held: nobody can take the old file after this
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        self._remove_made()

    def _remove_made(self) -> None:
        for folder in reversed(self._made):  # the run folder first, then the parents made for it
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break
        self._made = []

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class Holder(NamedTuple):
    """The process that holds a folder's lock, as its lock file says: its PID, and what it is
    doing there (None in a lock file written before that was recorded)."""

    pid: int
    doing: str | None

    def __str__(self) -> str:
        return f"process {self.pid} " + (f"is {self.doing}" if self.doing else "holds this folder")


def _read_holder(fd: int) -> Holder | None:
    try:
        lines = os.pread(fd, 1024, 0).decode("utf-8", "replace").split("\n")
    except OSError:
        return None
    if not lines[0].strip().isdigit():
        return None
    doing = lines[1].strip() if len(lines) > 2 else ""  # only a whole line (ended by its newline) counts
    return Holder(int(lines[0]), doing or None)


def holder_of(run_dir: Path | str) -> Holder | None:
    """The process that holds `run_dir`'s lock (training there, or preparing data into it), or
    None when nobody does."""
    path = Path(run_dir) / LOCK_FILE
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):  # no lock, or its holder removed it as it ended
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def holder(run_dir: Path | str) -> int | None:
    """The PID of the process that holds `run_dir`'s lock, or None when nobody does."""
    held = holder_of(run_dir)
    return held.pid if held else None
