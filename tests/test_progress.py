"""quantize/progress.py (issue #56): on a terminal one line rewritten in place with the stage, done/N, elapsed and
an estimate; in a log or CI one line per stage start and end; nothing under --quiet, nor outside a command."""

from __future__ import annotations

import io

import pytest

from quantize import progress
from quantize.quiet import quiet_libraries


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reporting(stream: Stream, clock: Clock, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(progress.time, "monotonic", clock)
    monkeypatch.setenv("COLUMNS", "200")
    return progress.shown(True, stream)


def test_a_log_gets_one_line_per_stage_start_and_end(monkeypatch):
    out, clock = Stream(tty=False), Clock()
    with reporting(out, clock, monkeypatch):
        outer, inner = "gate: baseline scores (tiny)", "scoring tiny with lm-eval: 4 items of core_facts"
        with progress.stage(outer) as top, progress.stage(inner, 4) as st:
            for _ in range(4):
                clock.now += 1.0
                st.advance()
        assert (top.inner, st.inner) == (1, 0)
        with pytest.raises(RuntimeError), progress.stage("gate: decision"):
            raise RuntimeError
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == [
        "quantize: gate: baseline scores (tiny) ...",
        "quantize: scoring tiny with lm-eval: 4 items of core_facts (4 items) ...",
        "quantize: scoring tiny with lm-eval: 4 items of core_facts: done, 4 items, 4.0s",
        "quantize: gate: baseline scores (tiny): done, 4.0s",
        "quantize: gate: decision ...",
        "quantize: gate: decision: stopped, 0.0s",
    ]


def test_a_terminal_gets_one_line_rewritten_with_counts_and_an_estimate(monkeypatch):
    out, clock = Stream(tty=True), Clock()
    with reporting(out, clock, monkeypatch), progress.stage("gate: candidate"), progress.stage("w4", 10) as st:
        for _ in progress.counted(st, range(4)):
            clock.now += 2.0
    text = out.getvalue()
    assert "\n" not in text.split("w4: done")[0]  # in place until the stage ends
    # the innermost stage under the outer one, its count (an item counts as it comes), elapsed, the estimate
    assert "\r\x1b[Kquantize: gate: candidate > w4: 3/10 items, 4.0s elapsed, ~9.3s left" in text
    assert text.endswith("\r\x1b[Kquantize: gate: candidate: done, 8.0s\n")
    assert "\r\x1b[Kquantize: w4: done, 4 items, 8.0s\n" in text


def test_a_note_ends_the_innermost_stage(monkeypatch):
    out, clock = Stream(tty=False), Clock()
    progress.note("outside any stage: nothing")
    with reporting(out, clock, monkeypatch), progress.stage("gate: baseline scores (tiny)"):
        progress.note("read from the cache")
    assert out.getvalue().splitlines()[-1] == "quantize: gate: baseline scores (tiny): done (read from the cache), 0.0s"


def test_a_terminal_line_fits_the_terminal(monkeypatch):
    out, clock = Stream(tty=True), Clock()
    with reporting(out, clock, monkeypatch), progress.stage("gate: candidate in stages (a long name)"):
        monkeypatch.setenv("COLUMNS", "50")
        with progress.stage("scoring it", 10) as st:
            clock.now += 1.0
            st.advance()
    drawn = out.getvalue().split("\r\x1b[K")[3]
    assert drawn == "quantize: ...1/10 items, 1.0s elapsed, ~9.0s left" and len(drawn) == 49


def test_redraws_are_throttled(monkeypatch):
    out, clock = Stream(tty=True), Clock()
    with reporting(out, clock, monkeypatch), progress.stage("many", 1000) as st:
        for _ in range(1000):
            clock.now += 0.001
            st.advance()
    assert out.getvalue().count("\r") < 10


def test_nothing_outside_a_command_or_under_quiet(capfd, monkeypatch):
    with progress.stage("the API is quiet by default", 2) as st:
        st.advance(2)
    out = Stream(tty=True)
    with progress.shown(False, out), progress.stage("quiet", 1) as st:
        st.advance()
    assert out.getvalue() == ""
    with quiet_libraries(True), progress.stage("--quiet"):
        pass
    assert capfd.readouterr().err == ""
    with quiet_libraries(False), progress.stage("not quiet"):
        pass
    err = capfd.readouterr().err
    assert "quantize: not quiet ..." in err and "quantize: not quiet: done" in err


def test_a_broken_stderr_never_stops_the_work():
    out = Stream(tty=False)
    out.close()
    with progress.shown(True, out), progress.stage("still runs", 1) as st:
        st.advance()
