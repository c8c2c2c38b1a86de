"""Errors a user can cause, and the exit code each one maps to.

Exit codes for every command (DESIGN.md): 0 ok/pass, 1 gate rejected,
2 bad input, 3 runtime failure.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_RUNTIME = 3


class UsageError(ValueError):
    """Bad input from the user: a recipe, a path, a flag. Says what is wrong and what to do."""

    exit_code = EXIT_USAGE


class RuntimeFailure(RuntimeError):
    """The input was valid but the work failed (a non-finite model, a failed engine run)."""

    exit_code = EXIT_RUNTIME
