"""The one exception type the command line turns into a single clear error line.

Anything raised as a `UserError` is a problem with the user's input (a path, a flag, a file's
contents) and its message says what is wrong and what to do. Everything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A problem with the user's input; the message is shown as-is, without a traceback."""


def check_folder_path(path, flag: str) -> None:
    """Refuse an output folder that cannot be created because a file stands where a folder must.

    Without this, mkdir fails deep inside the work with FileExistsError or NotADirectoryError."""
    from pathlib import Path

    path = Path(path).expanduser()
    for place in (path, *path.parents):
        if place.exists():
            if not place.is_dir():
                raise UserError(f"{place}: is a file, not a folder, so {path} cannot be made there; choose another {flag}")
            return


def check_output_file(path, suffix: str, flag: str, force: bool = False) -> None:
    """Refuse, before any work, an output file the command could not write, or should not: a
    folder or a non-regular file in its place, a folder that cannot be made, or a name without
    `suffix` (the kind of file the command makes; any file by that name would be replaced),
    unless `force`. A file of the right kind is replaced whole (see fileio.atomic_write)."""
    from pathlib import Path

    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder; give a file name ending in {suffix}")
    if path.exists() and not path.is_file():
        raise UserError(f"{flag} {path}: not a regular file; give a file name ending in {suffix}")
    if path.suffix.lower() != suffix and not force:
        what = f"a {suffix} file would replace it" if path.exists() else f"the name does not end in {suffix}"
        raise UserError(f"{flag} {path}: {what}; give a name ending in {suffix} (or pass --force)")
    check_folder_path(path.parent, flag)


def read_failure(exc: BaseException) -> str:
    """Why a file could not be read, in one short line (torch's refusals run over many lines).

    A pickle that torch's weights-only loader refused is named as such: it asked for an object
    other than tensors and plain data, and unpickling that object is how a file runs code."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if unsafe:
        return (f"refused: it holds a pickled {unsafe.group(1)}, not only tensors, and unpickling that could run "
                "code; use a file from a source you trust, or make it again")
    if text.startswith("Weights only load failed"):  # torch's advice to retry unsafely is not for us to pass on
        reason = re.search(r"WeightsUnpickler error:\s*(.+)", text)
        detail = reason.group(1).strip().splitlines()[0] if reason else "not a plain file of tensors"
        return (f"refused: the safe (weights-only) loader cannot read it ({detail}); save it again with "
                "torch.save or, better, as safetensors")
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no details'}"


class ConfigError(UserError, ValueError):
    """An invalid configuration field. A ValueError too, so library callers can catch either."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
