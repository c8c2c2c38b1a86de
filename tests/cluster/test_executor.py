"""The executor's graph as the driver hands it to Ray, over a stand-in for Ray that runs each task when Ray would (its
inputs resolved first): what each task is given, what it asks for, and what the driver makes of the results. The
tasks here are not the sweep's: the executor reads only a task's label, slug and kind, and runs the function it is
given. The real clusters are in tests/sweep/test_sweep.py, test_matrix.py and tests/search."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantize.cluster import executor
from quantize.cluster.executor import Executor, Outcome, StartMark
from quantize.cluster.spec import SLOT, Resources


@dataclass(frozen=True)
class Job:
    """A task of no stage: what the executor reads of one, and nothing else."""

    kind: str
    name: str | None = None

    @property
    def label(self) -> str:
        return self.kind if self.name is None else f"{self.kind} {self.name}"

    @property
    def slug(self) -> str:
        return self.kind if self.name is None else f"{self.kind}-{self.name}"


def never(task, state, node, host, threads):
    raise AssertionError(f"{task.label} was run")


class Ref:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


class TaskError(Exception):
    pass


class RaisedError(TaskError):
    """Ray's error for a task function that raised: the exception itself as `cause`, its text Ray's traceback."""

    def __init__(self, cause: Exception) -> None:
        super().__init__("Traceback (most recent call last):\n\x1b[36mray::_in_worker()\x1b[39m ...")
        self.cause = cause


class StandIn:
    """Submitting runs the task at once with its inputs' values, as Ray does once they are ready; an input that is an
    error makes the task's result that error without running it (Ray's rule). `body` plays the worker."""

    class exceptions:  # the names Ray's module has
        RayError = TaskError
        RayTaskError = RaisedError

    def __init__(self, body):
        self.body, self.submitted, self.waits, self.work = body, [], 0, []

    def remote(self, **opts):
        standin = self

        class Remote:
            def options(self, **o):
                standin.submitted.append(o)
                return self

            def remote(self, work, task, state, threads, *inputs):
                standin.work.append(work)
                if bad := next((i for i in inputs if i.error is not None), None):
                    return Ref(error=bad.error)
                try:
                    return Ref(standin.body(task, [i.value for i in inputs]))
                except TaskError as e:
                    return Ref(error=e)

        assert opts == {"max_calls": 1}
        return lambda f: Remote()

    def wait(self, refs, num_returns):
        self.waits += 1
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if ref.error is not None:
            raise ref.error
        return ref.value


def outcome(code: int, message: str = "") -> Outcome:
    return Outcome(pid=1, exit_code=code, message=message, record=None, scored=[], seconds=1.0, threads=1)


def graph(tmp_path: Path, body, slots: bool = False):
    ex = Executor(tmp_path, 2, lambda line: None, never)
    base = ex.add(Job("baseline"), Resources())
    tracks = {}
    for name in ("good", "broken", "lost"):
        conv = ex.add(Job("convert", name), Resources())
        tracks[name] = (
            conv,
            ex.add(Job("gate", name), Resources(num_cpus=2, resources={"big": 1}), after=[base, conv]),
        )
    ray = StandIn(body)
    ex.run(ray, slots=slots)
    return ex, tracks, ray


def test_each_gate_is_given_its_inputs_results_and_runs_only_when_they_succeeded(tmp_path):
    given = {}

    def body(task, inputs):
        if task.kind == "gate":
            given[task.name] = [i.message for i in inputs]
            if any(i.exit_code for i in inputs):  # what the worker does with a failed input
                return Outcome(**{**outcome(3, "not run").model_dump(), "not_run": True})
            return outcome(0, "PASS")
        if task.name == "broken":
            return outcome(3, "failed: conversion")
        if task.name == "lost":
            raise TaskError("worker died")
        return outcome(0, task.label)

    ex, tracks, ray = graph(tmp_path, body)
    assert given["good"] == ["baseline", "convert good"]  # the baseline's and its conversion's results, in order
    assert tracks["good"][1].state == "done" and tracks["good"][1].message == "PASS"
    for name, why in (("broken", "failed: conversion"), ("lost", "its worker died 3 times")):
        conv, gate = tracks[name]
        assert conv.state == "failed" and why in conv.message
        assert gate.state == "not run" and gate.message.startswith(f"not run: convert {name} failed")
        assert gate.outcome is None
    assert "lost" not in given  # Ray never ran the gate of a conversion that raised
    assert ray.waits == len(ex.tracks)  # one wait per result: nothing polled
    assert ray.work == [never] * len(ex.tracks)  # every worker is handed the executor's function


def test_a_worker_given_a_failed_input_runs_nothing(tmp_path):
    got = executor._in_worker(never, Job("gate", "c"), str(tmp_path), 1, outcome(0), outcome(3, "failed: conversion"))
    assert got.not_run and got.exit_code == 3 and list(tmp_path.iterdir()) == []  # no start mark, no log


def test_resources_and_max_parallel_are_what_each_task_asks_ray_for(tmp_path):
    ex, _, ray = graph(tmp_path, lambda task, inputs: outcome(0), slots=True)
    gates = [o for o, t in zip(ray.submitted, ex.tracks, strict=True) if t.task.kind == "gate"]
    assert gates[0]["num_cpus"] == 2 and gates[0]["resources"] == {"big": 1, SLOT: 1.0}
    assert gates[0]["max_retries"] == 2 and gates[0]["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "2"
    base = ray.submitted[0]
    assert base["resources"] == {SLOT: 1.0} and base["num_cpus"] == 1


def test_each_start_is_said_while_its_task_runs_from_its_start_mark(tmp_path):
    """The `running` and `retried` lines come from the start marks as the driver's watcher finds them, while Ray's
    wait still blocks (before, marks were read only when a result came: a long task's start was said at its end);
    each mark is said once, in the order the attempts started."""
    import threading

    lines, retried = [], threading.Event()

    def say(line):
        lines.append(line)
        if line.startswith("retried"):
            retried.set()

    def body(task, inputs):  # a first attempt that died, then the retry that is running now
        for pid, started in ((101, "2026-12-04T05:00:00+00:00"), (102, "2026-12-04T05:00:09+00:00")):
            mark = StartMark(task=task.label, pid=pid, node="n" * 20, host="h", threads=1, started=started)
            (tmp_path / f"{task.slug}.{pid}.start").write_text(mark.model_dump_json())
        return outcome(0, "converted")

    class Running(StandIn):
        def wait(self, refs, num_returns):  # no result until both starts were said
            assert retried.wait(timeout=60), lines
            return super().wait(refs, num_returns)

    ex = Executor(tmp_path, 2, say, never, watch_seconds=0.01)
    ex.add(Job("convert", "c"), Resources())
    ex.run(Running(body))
    assert lines == [
        "queued    convert c",
        "running   convert c on node nnnnnnnnnnnn (h, pid 101, 1 threads)",
        "retried   convert c: attempt 2 on node nnnnnnnnnnnn (h, pid 102, 1 threads) (the worker before it died)",
        "done      convert c in 1 s: converted",
    ]
    assert list(ex.tracks[0].starts) == [101, 102]


def test_a_start_mark_is_written_whole_under_the_tasks_slug_and_read_back(tmp_path):
    """What a worker writes first (`mark_start`) is what the driver's watcher reads: the file named by the task's
    slug and the worker's pid, its label inside."""
    import os

    executor.mark_start(tmp_path, Job("gate", "w8"), "node-1", "10.0.0.2", 3)
    (f,) = tmp_path.iterdir()
    assert f.name == f"gate-w8.{os.getpid()}.start"
    mark = StartMark.model_validate_json(f.read_bytes())
    assert (mark.task, mark.pid, mark.node, mark.host, mark.threads) == (
        "gate w8",
        os.getpid(),
        "node-1",
        "10.0.0.2",
        3,
    )
    lines = []
    ex = Executor(tmp_path, 0, lines.append, never)
    ex.add(Job("gate", "w8"), Resources())
    ex._read_starts()
    assert lines[-1] == f"running   gate w8 on node node-1 (10.0.0.2, pid {os.getpid()}, 3 threads)"


def test_a_task_that_raised_or_returned_no_outcome_is_failed_with_what_it_said(tmp_path):
    """A task function that raised (a state folder the node cannot write) was reported as "its worker died 3 times"
    (it ran once: exceptions are not retried) with Ray's coloured traceback as the reason; a result that is not an
    Outcome stopped the driver with an AttributeError, no sweep.json written. Each is its task's failure now."""

    def body(task, inputs):
        if task.name == "broken":
            raise RaisedError(OSError("[Errno 30] Read-only file system: '/state'\x1b[2J"))
        if task.name == "lost":
            return {"exit_code": 0}
        return outcome(0, task.label)

    _, tracks, _ = graph(tmp_path, body)
    broken, lost = tracks["broken"][0], tracks["lost"][0]
    assert broken.state == "failed" and broken.exit_code == 3
    assert broken.message == (
        "failed: the task raised in its worker (OSError: [Errno 30] Read-only file system: '/state'\\x1b[2J)"
    )
    assert lost.state == "failed" and lost.message == "failed: the task returned dict, not an Outcome (a bug)"
    assert tracks["good"][1].state == "done" and tracks["lost"][1].state == "failed"
