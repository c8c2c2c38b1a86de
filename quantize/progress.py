"""Where long work is (issue #56), on stderr: the stages a command goes through (scoring, looks, agreement,
conversion phases), items done of N, elapsed and an estimate. On a terminal one line rewritten in place; in a log
or CI (stderr not a terminal) one line when a stage starts and one when it ends; nothing under --quiet.

Stages say where they are with `stage(name, total)`; whether anything is shown is decided once, by the command,
through `shown(on)` (quantize/quiet.py's `quiet_libraries` does it: progress is shown exactly when the libraries
are not quieted). A stage outside any `shown` prints nothing: the Python API is quiet by default."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO, TypeVar

T = TypeVar("T")
PREFIX = "quantize: "
REDRAW_SECONDS = 0.2  # a terminal line is rewritten at most this often (and always at a stage's start and end)


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:  # seconds, then minutes
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    m, s = divmod(s, 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


class Reporter:
    """Writes the stages' lines to `stream`; `tty` (default: the stream's isatty) picks in-place or line mode."""

    def __init__(self, stream: TextIO, tty: bool | None = None, clock: Callable[[], float] | None = None) -> None:
        self.stream, self.clock = stream, clock if clock is not None else time.monotonic
        self.tty = _isatty(stream) if tty is None else tty
        self.open: list[Stage] = []
        self.drawn = 0.0  # when the terminal line was last rewritten

    def write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr never stops the work
            pass

    def started(self, st: Stage) -> None:
        if self.open:
            self.open[-1].inner += 1
        self.open.append(st)
        if self.tty:
            self.draw(force=True)
        else:
            self.write(f"{PREFIX}{st.name}{st.of()} ...\n")

    def advanced(self, st: Stage) -> None:
        if self.tty:
            self.draw()

    def ended(self, st: Stage, failed: bool) -> None:
        if st in self.open:
            self.open.remove(st)
        how = "stopped" if failed else "done"
        done = f"{st.done} {st.unit}, " if st.total is not None or st.done else ""
        note = f" ({st.note})" if st.note else ""
        line = f"{PREFIX}{st.name}: {how}{note}, {done}{_duration(st.elapsed())}"
        if self.tty:
            self.write(f"\r\x1b[K{line}\n")
            if self.open:
                self.draw(force=True)
        else:
            self.write(line + "\n")

    def draw(self, force: bool = False) -> None:
        """The open stages as one terminal line, rewritten in place: the outer stages' names, the innermost's
        count, elapsed and estimate."""
        now = self.clock()
        if not self.open or (not force and now - self.drawn < REDRAW_SECONDS):
            return
        self.drawn = now
        st = self.open[-1]
        line = f"{PREFIX}{' > '.join(s.name for s in self.open)}{st.status()}"
        width = shutil.get_terminal_size((120, 24)).columns - 1  # a wrapped line could not be rewritten in place
        if len(line) > width:  # the counts and the estimate kept, the outer stages' names cut
            line = PREFIX + "..." + line[len(line) - max(0, width - len(PREFIX) - 3) :]
        self.write(f"\r\x1b[K{line}")


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


class Stage:
    """One stage of work: `advance(n)` as units finish; `note` is added to its end line ("from the cache")."""

    def __init__(self, reporter: Reporter | None, name: str, total: int | None, unit: str) -> None:
        self.reporter, self.name, self.total, self.unit = reporter, name, total, unit
        self.done, self.note = 0, ""
        self.inner = 0  # the stages started inside this one
        self.t0 = reporter.clock() if reporter is not None else 0.0

    def elapsed(self) -> float:
        return self.reporter.clock() - self.t0 if self.reporter is not None else 0.0

    def of(self) -> str:
        return f" ({self.total} {self.unit})" if self.total is not None else ""

    def status(self) -> str:
        """`: 12/40 items, 30s elapsed, ~1m10s left` (the estimate from the rate so far)."""
        if self.total is None:
            return f": {_duration(self.elapsed())} elapsed"
        out = f": {self.done}/{self.total} {self.unit}, {_duration(self.elapsed())} elapsed"
        if 0 < self.done < self.total:
            out += f", ~{_duration(self.elapsed() / self.done * (self.total - self.done))} left"
        return out

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.reporter is not None:
            self.reporter.advanced(self)


_SHOWN: ContextVar[Reporter | None] = ContextVar("quantize_progress", default=None)


@contextmanager
def shown(on: bool, stream: TextIO | None = None, tty: bool | None = None) -> Iterator[None]:
    """Progress shown (on `stream`, stderr by default, as it is now: before any redirection) while inside, or
    not at all (`on` False: --quiet). Nested calls take the innermost."""
    token = _SHOWN.set(Reporter(stream if stream is not None else sys.stderr, tty) if on else None)
    try:
        yield
    finally:
        _SHOWN.reset(token)


@contextmanager
def stage(name: str, total: int | None = None, unit: str = "items") -> Iterator[Stage]:
    """A stage of work, reported where progress is shown (its start and end; `advance` in between)."""
    reporter = _SHOWN.get()
    st = Stage(reporter, name, total, unit)
    if reporter is None:
        yield st
        return
    reporter.started(st)
    failed = True
    try:
        yield st
        failed = False
    finally:
        reporter.ended(st, failed)


def note(text: str) -> None:
    """A word for the end line of the innermost stage open where progress is shown ("read from the cache")."""
    reporter = _SHOWN.get()
    if reporter is not None and reporter.open:
        reporter.open[-1].note = text


def counted(st: Stage | None, items: Iterable[T], n: int = 1) -> Iterator[T]:
    """`items` passed through, the stage (if any) advanced by `n` as each is taken."""
    for x in items:
        if st is not None:
            st.advance(n)
        yield x
