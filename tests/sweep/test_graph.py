"""The sweep's graph as the driver hands it to Ray, over a stand-in for Ray that runs each task when Ray would (its
inputs resolved first): what each task is given, what it asks for, and what the driver makes of the results. The
real clusters are in test_sweep.py and test_matrix.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantize.errors import UsageError
from quantize.sweep import run as sweep_run
from quantize.sweep.spec import Cluster, Resources
from quantize.sweep.tasks import Outcome, TaskSpec

SPEC = {"policy": "p.yaml", "baseline": "base"}


class Ref:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


class TaskError(Exception):
    pass


class StandIn:
    """Submitting runs the task at once with its inputs' values, as Ray does once they are ready; an input that is an
    error makes the task's result that error without running it (Ray's rule). `body` plays the worker."""

    class exceptions:  # the name Ray's module has
        RayError = TaskError

    def __init__(self, body):
        self.body, self.submitted, self.waits = body, [], 0

    def remote(self, **opts):
        standin = self

        class Remote:
            def options(self, **o):
                standin.submitted.append(o)
                return self

            def remote(self, task, state, threads, *inputs):
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
    ex = sweep_run.Executor(tmp_path, 2, lambda line: None)
    base = ex.add(TaskSpec(kind="baseline", **SPEC), Resources())
    tracks = {}
    for name in ("good", "broken", "lost"):
        conv = ex.add(TaskSpec(kind="convert", candidate=name, recipe="r.yaml", checkpoint=name, **SPEC), Resources())
        gate = TaskSpec(kind="gate", candidate=name, checkpoint=name, **SPEC)
        tracks[name] = (conv, ex.add(gate, Resources(num_cpus=2, resources={"big": 1}), after=[base, conv]))
    ray = StandIn(body)
    ex.run(ray, slots=slots)
    return ex, tracks, ray


def test_each_gate_is_given_its_inputs_results_and_runs_only_when_they_succeeded(tmp_path):
    given = {}

    def body(task, inputs):
        if task.kind == "gate":
            given[task.candidate] = [i.message for i in inputs]
            if any(i.exit_code for i in inputs):  # what the worker does with a failed input
                return Outcome(**{**outcome(3, "not run").model_dump(), "not_run": True})
            return outcome(0, "PASS")
        if task.candidate == "broken":
            return outcome(3, "failed: conversion")
        if task.candidate == "lost":
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


def test_a_worker_given_a_failed_input_runs_nothing(tmp_path):
    gate = TaskSpec(kind="gate", candidate="c", checkpoint="c", **SPEC)
    got = sweep_run._in_worker(gate, str(tmp_path), 1, outcome(0), outcome(3, "failed: conversion"))
    assert got.not_run and got.exit_code == 3 and list(tmp_path.iterdir()) == []  # no start mark, no log


def test_resources_and_max_parallel_are_what_each_task_asks_ray_for(tmp_path):
    ex, _, ray = graph(tmp_path, lambda task, inputs: outcome(0), slots=True)
    gates = [o for o, t in zip(ray.submitted, ex.tracks, strict=True) if t.task.kind == "gate"]
    assert gates[0]["num_cpus"] == 2 and gates[0]["resources"] == {"big": 1, sweep_run.SLOT: 1.0}
    assert gates[0]["max_retries"] == 2 and gates[0]["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "2"
    base = ray.submitted[0]
    assert base["resources"] == {sweep_run.SLOT: 1.0} and base["num_cpus"] == 1


def test_a_task_asking_for_a_custom_resource_no_node_offers_is_refused(fake_ray):
    with pytest.raises(UsageError, match=r"resources\.gate asks each task for 1 CPUs, 0 GPUs, 1 big, and no node"):
        sweep_run.check_fits(fake_ray, {"gate": Resources(resources={"big": 1})})


@pytest.mark.parametrize(
    "resources,says",
    [({"CPU": 1}, "not a custom resource"), ({"quantize_sweep_slot": 1}, r"quantize_\* are the sweep's")]
    + [({"big": 0}, "above 0"), ({"a b": 1}, "not a custom resource")],
)
def test_custom_resource_names_and_amounts(resources, says):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=says):
        Resources(resources=resources)


def test_max_parallel_on_a_running_cluster_is_refused_before_ray(lab):
    f = lab.sweep(checkpoints=[lab.tiny], extra="max_parallel: 2\n")
    with pytest.raises(UsageError, match="max_parallel = 2 caps the tasks of a local cluster"):
        sweep_run.plan_sweep(f, address="auto")
    assert Cluster(address="local", resources={"big": 2}).resources == {"big": 2}


def test_each_start_is_said_while_its_task_runs_from_its_start_mark(tmp_path):
    """The `running` and `retried` lines come from the start marks as the driver's watcher finds them, while Ray's
    wait still blocks (before, marks were read only when a result came: a long task's start was said at its end);
    each mark is said once, in the order the attempts started."""
    import threading

    from quantize.sweep.tasks import StartMark

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

    ex = sweep_run.Executor(tmp_path, 2, say, watch_seconds=0.01)
    ex.add(TaskSpec(kind="convert", candidate="c", recipe="r.yaml", checkpoint="c", **SPEC), Resources())
    ex.run(Running(body))
    assert lines == [
        "queued    convert c",
        "running   convert c on node nnnnnnnnnnnn (h, pid 101, 1 threads)",
        "retried   convert c: attempt 2 on node nnnnnnnnnnnn (h, pid 102, 1 threads) (the worker before it died)",
        "done      convert c in 1 s: converted",
    ]
    assert list(ex.tracks[0].starts) == [101, 102]
