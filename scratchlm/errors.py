"""The one exception type the command line turns into a single clear error line.

Anything raised as a `UserError` is a problem with the user's input (a path, a flag, a file's
contents) and its message says what is wrong and what to do. Everything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A problem with the user's input; the message is shown as-is, without a traceback."""


class ConfigError(UserError, ValueError):
    """An invalid configuration field. A ValueError too, so library callers can catch either."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
