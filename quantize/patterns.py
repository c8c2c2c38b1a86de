"""A user's regular expressions: compiled with one message (`compile_pattern`), and searched under a time limit.

Every regular expression a user writes (a recipe's `re:` targets, ignore and overrides, a gguf recipe's
`tensor_types`, `golden new --regex`) is compiled by `compile_pattern`: re.compile raises re.error for a pattern
it cannot read, but OverflowError for a repetition count over its limit (`a{99999999999}`) and RecursionError for
groups nested some hundreds deep, which were exit 3 (a review); all three are one UsageError naming the field and
the pattern, shortened.

A pattern that compiles can still take exponential time: a repetition inside a repetition ((a+)+, (.*)*) backtracks
through every way of splitting a text it does not match. `searched` runs the searches in a child process
(`python -m quantize.patterns`) under a time limit and names the first pattern that ran past it (`SlowPattern`): a
gguf recipe's tensor_types over the model's tensor names (convert/gguf.first_patterns), and `golden new --regex`
over the items' answers and runs of one character (golden/new.py), where lm-eval would run it on every generated
answer.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from quantize.errors import RuntimeFailure, UsageError
from quantize.machine import python_child

SHOWN = 80  # characters of a pattern a message shows


def compile_pattern(pattern: str, field: str, written: str | None = None) -> re.Pattern[str]:
    """`pattern` compiled by Python's re module; one it cannot compile (re.error, a repetition count over re's
    limit, groups nested too deep) is a UsageError naming `field` and the pattern as the user wrote it (`written`,
    e.g. with its `re:` prefix), shortened."""
    try:
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as e:
        why = "groups nested too deeply" if isinstance(e, RecursionError) else str(e)
        text = pattern if written is None else written
        short = text if len(text) <= SHOWN else text[:SHOWN] + "…"
        raise UsageError(
            f"{field}: {short!r} is not a regular expression ({why}); write it as Python's re module reads it"
        ) from None


class SlowPattern(Exception):
    """A pattern whose search ran past the time limit (`searched`): `index` is its place among the patterns."""

    def __init__(self, pattern: str, index: int, seconds: float) -> None:
        super().__init__(f"pattern {pattern!r} took more than {seconds} s")
        self.pattern, self.index, self.seconds = pattern, index, seconds


def searched(patterns: list[str], texts: list[str], seconds: float) -> list[list[int]]:
    """For each pattern in order, the indices of the texts it matches (re.search), computed in a child process
    under `seconds` in all: a pattern that backtracks exponentially would hang this process, and cannot be
    stopped inside it. The first pattern whose search ran past the limit raises SlowPattern. Each pattern must
    compile (compile_pattern)."""
    if not patterns:
        return []
    command, env = python_child(__name__)
    given = json.dumps({"texts": texts, "patterns": patterns})
    try:
        done = subprocess.run(
            command, input=given, capture_output=True, text=True, timeout=seconds, check=False, env=env
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        index = len(out.splitlines())
        raise SlowPattern(patterns[index], index, seconds) from None
    found = [json.loads(line) for line in done.stdout.splitlines()]
    if done.returncode != 0 or len(found) != len(patterns):
        raise RuntimeFailure(f"the regular expression search failed (exit {done.returncode}): {done.stderr[-500:]}")
    return found


def _search(given: dict[str, list[str]]) -> None:
    """The child of `searched`: for each pattern in order, one line of the indices of the texts it matches."""
    texts = given["texts"]
    for pattern in given["patterns"]:
        rx = re.compile(pattern)
        print(json.dumps([i for i, t in enumerate(texts) if rx.search(t)]), flush=True)


if __name__ == "__main__":
    _search(json.loads(sys.stdin.read()))
