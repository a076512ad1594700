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
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no details'}"


class ConfigError(UserError, ValueError):
    """An invalid configuration field. A ValueError too, so library callers can catch either."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
