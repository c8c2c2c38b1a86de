"""Errors a user can cause, and the exit code each one maps to.

Exit codes for every command (docs/design.md): 0 ok/pass, 1 gate rejected, 2 bad input, 3 runtime failure,
130 interrupted (143 terminated, 129 hung up). The CLI maps every exception to one of these here and nowhere else.
"""

from __future__ import annotations

import errno

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_RUNTIME = 3
EXIT_INTERRUPTED = 130  # Ctrl-C; a SIGTERM or SIGHUP unwinds the same way and exits 128 + its number (143, 129)

# OS errors that say a path given on the command line, to the API or in a file cannot name a file: the user's input
BAD_PATH = {errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR}


class UsageError(ValueError):
    """Bad input from the user: a recipe, a path, a flag. Says what is wrong and what to do."""

    exit_code = EXIT_USAGE
    says = "error"  # how the CLI introduces the message


class KeywordError(UsageError):
    """Bad input given to a function of the Python API as one of its keywords: the message names the keyword
    (`budget`), and the CLI, which passes a flag's value straight to that keyword, names the flag instead
    (`for_flag`; cli.py). `template` holds `{name}` where the keyword is named and `{got}` where the value is shown;
    `flag_template`, where given, is the wording for a flag (which cannot be None where the keyword can)."""

    def __init__(
        self, function: str, keyword: str, template: str, value: object = None, flag_template: str | None = None
    ) -> None:
        self.function, self.keyword, self.value = function, keyword, value
        self.template, self.flag_template = template, flag_template or template
        super().__init__(f"quantize.{function}: {template.format(name=f'`{keyword}`', got=_shown(value))}")

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:  # pickled whole (a worker's error), not by its message
        return KeywordError, (self.function, self.keyword, self.template, self.value, self.flag_template)

    def for_flag(self, flag: str, got: str) -> str:
        """The message with the flag `flag` named for the keyword, its value shown as `got`."""
        return self.flag_template.format(name=flag, got=got)


def _shown(value: object) -> str:
    import reprlib

    return f"{type(value).__name__} {reprlib.repr(value)}"


class QuantizeWarning(UserWarning):
    """Something the user should know that stops nothing (leftovers of killed runs, trust_remote_code on, a
    candidate left out): the Python API warns with it, the CLI prints it on stderr."""


class RuntimeFailure(RuntimeError):
    """The input was valid but the work failed (a non-finite model, a failed engine run)."""

    exit_code = EXIT_RUNTIME
    says = "failed"


def path_error(e: OSError) -> UsageError | None:
    """The UsageError an OS error stands for when it says a path the user gave cannot name a file (BAD_PATH: too
    long, a loop of links, a file where a folder is needed or the reverse); None for any other OS error. The API's
    boundary (api._takes) and the CLI's top both map with it."""
    if e.errno not in BAD_PATH:
        return None
    where = f": {e.filename!s:.200}" if e.filename is not None else ""
    return UsageError(f"{e.strerror}{where}; check the path")
