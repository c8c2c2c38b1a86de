"""Errors a user can cause, and the exit code each one maps to.

Exit codes for every command (docs/design.md): 0 ok/pass, 1 gate rejected, 2 bad input, 3 runtime failure,
130 interrupted (143 terminated, 129 hung up). The CLI maps every exception to one of these here and nowhere else.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_RUNTIME = 3
EXIT_INTERRUPTED = 130  # Ctrl-C; a SIGTERM or SIGHUP unwinds the same way and exits 128 + its number (143, 129)


class UsageError(ValueError):
    """Bad input from the user: a recipe, a path, a flag. Says what is wrong and what to do."""

    exit_code = EXIT_USAGE
    says = "error"  # how the CLI introduces the message


class QuantizeWarning(UserWarning):
    """Something the user should know that stops nothing (leftovers of killed runs, trust_remote_code on, a
    candidate left out): the Python API warns with it, the CLI prints it on stderr."""


class RuntimeFailure(RuntimeError):
    """The input was valid but the work failed (a non-finite model, a failed engine run)."""

    exit_code = EXIT_RUNTIME
    says = "failed"
