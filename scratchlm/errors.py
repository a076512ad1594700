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


class ConfigError(UserError, ValueError):
    """An invalid configuration field. A ValueError too, so library callers can catch either."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
