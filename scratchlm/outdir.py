"""Output folders: whose they are, and one writer at a time.

The rule for every command that writes a folder: it writes only into a folder it makes, or an
empty one, or one that holds only what the same command wrote there before; never into a folder
that holds its own input; and one writer at a time. Anything else is refused before a byte is
written, so nothing a user made is ever replaced.

A command that publishes a folder leaves a marker in it, MARKER, whose one line names the command
(`scratchlm prepare`): that is how a later run of the same command knows the folder is its own,
even when the names inside look like anyone's (a user's own `meta.json` or `train.bin`). The lock
is the run folders' (scratchlm.runlock, a flock on FOLDER/.lock).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from scratchlm.errors import UserError
from scratchlm.fileio import ATOMIC_SUFFIX, atomic_prefix, atomic_write
from scratchlm.runlock import LOCK_FILE, FolderBusy, RunLock, holder_of

MARKER = ".scratchlm-output"
"""The marker file: `scratchlm <command>` and a newline."""


def made_by(folder: Path) -> str | None:
    """The command the folder's marker names, or None (no marker, or not one of ours)."""
    try:
        text = (Path(folder) / MARKER).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.startswith("scratchlm ") and "\n" not in text else None


def mark(folder: Path, command: str) -> None:
    """Say in `folder` that `command` made it (the marker is written whole or not at all)."""
    for stale in Path(folder).glob(f"{atomic_prefix(MARKER)}*{ATOMIC_SUFFIX}"):  # an earlier marker's write that a kill interrupted
        stale.unlink(missing_ok=True)
    with atomic_write(Path(folder) / MARKER, "w") as f:
        f.write(f"{command}\n")


def _foreign(folder: Path, command: str, own: Callable[[str], bool], legacy: Callable[[Path], bool] | None) -> list[str]:
    """The names in `folder` that `command` did not write there, sorted (empty: the folder is its own)."""
    names = sorted(p.name for p in folder.iterdir())
    if not names:
        return []
    by = made_by(folder)
    if by is not None and by != command:
        return names  # another scratchlm command's output: not ours to change
    others = [n for n in names if n not in (LOCK_FILE, MARKER) and not n.startswith(atomic_prefix(MARKER)) and not own(n)]
    if others:
        return others
    outputs = [n for n in names if not n.startswith(".")]  # a killed try leaves hidden names (lock, staging, marker's temp)
    if by == command or not outputs or (legacy is not None and legacy(folder)):
        return []
    return outputs  # only names this command writes, but unmarked and no complete output: a user's files by those names


def _refusal(folder: Path, command: str, flag: str, foreign: list[str]) -> UserError:
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    run = (folder / "latest").is_file() or any(n.startswith("ckpt-") for n in foreign)
    what = "is a training run's folder" if run else "holds files"
    return UserError(f"{flag} {folder}: {what} that `{command}` did not write ({shown}); it writes only into a new or "
                     "empty folder, or one it wrote before, so that nothing else is replaced: choose another "
                     f"{flag}")


def _check(folder: Path, command: str, flag: str, own, legacy, inputs: list[Path]) -> None:
    check_not_input(folder, inputs, flag)
    if folder.is_dir():
        foreign = _foreign(folder, command, own, legacy)
        if foreign:
            raise _refusal(folder, command, flag, foreign)


def claim_folder(folder: Path | str, command: str, flag: str, *, own: Callable[[str], bool],
                 inputs: Iterable[Path | str] = (), legacy: Callable[[Path], bool] | None = None,
                 doing: str = "writing in this folder", wait: bool = False) -> RunLock:
    """Make `folder` this command's to write, and return its lock (held; release it when done).

    Refused with one line, before anything is written: a folder holding a name `own` does not
    accept, or one marked by another command; a folder whose own-looking names carry no marker
    and that `legacy` (a check that it is a complete output of this command, from before markers)
    does not accept; a folder that holds one of `inputs`; a folder another process holds (unless
    `wait`: then this says so in one line and waits for it). The check runs again once the lock
    is held, so a writer that finished in between is seen. A folder the lock made is removed
    again on release when empty."""
    folder = Path(folder).expanduser()
    paths = [Path(p).expanduser() for p in inputs]
    _check(folder, command, flag, own, legacy, paths)
    lock = RunLock(folder, doing=doing, flag=flag)
    try:
        lock.acquire()
    except FolderBusy:
        if not wait:
            raise
        held = holder_of(folder)  # None: the holder ended since; the wait below then takes the lock at once
        if held is not None:
            print(f"note: {folder}: {held}; waiting for it to end", file=sys.stderr, flush=True)
        lock.acquire(wait=True)
    try:
        _check(folder, command, flag, own, legacy, paths)
    except BaseException:
        lock.release()
        raise
    return lock


def check_not_input(out: Path | str, inputs: Iterable[Path | str], flag: str) -> None:
    """Refuse an output (a file, or a folder the command writes into) that is one of the
    command's own inputs, lies inside an input folder, or holds an input (`--force` lets a file
    name without the usual suffix through, never this): writing there would change the input."""
    where = Path(out).expanduser().resolve()
    for path in inputs:
        path = Path(path).expanduser().resolve()
        how = "is" if where == path else "lies in" if path in where.parents else "holds" if where in path.parents else None
        if how:
            raise UserError(f"{flag} {out}: {how} this command's own input ({path}); write the output to another {flag}")
