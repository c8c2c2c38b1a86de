"""One executor's run on a cluster, from connecting to shutting down, over a stand-in for Ray's connection: what a
local cluster offers, what the workers get from the driver's environment, the probe taken before a local cluster
starts, and what must fit before anything is submitted."""

from __future__ import annotations

import pytest

from quantize.cluster.connect import on_cluster
from quantize.cluster.executor import Executor
from quantize.cluster.spec import SLOT, Cluster, Resources
from quantize.errors import UsageError

from .test_executor import Job, never


def executor(tmp_path, monkeypatch, lines=None) -> tuple[Executor, list[bool]]:
    """An executor whose run is recorded (its `slots`), not submitted."""
    ex = Executor(tmp_path, 0, (lines if lines is not None else []).append, never)
    runs: list[bool] = []
    monkeypatch.setattr(ex, "run", lambda ray, slots=False: runs.append(slots))
    return ex, runs


def test_only_the_kinds_of_task_that_run_must_fit_a_node(tmp_path, monkeypatch, fake_ray):
    ex, _ = executor(tmp_path, monkeypatch)
    ex.add(Job("gate", "c"), Resources(num_cpus=2))
    # a run with nothing to convert is not refused for what its convert tasks would have asked
    nodes = on_cluster(fake_ray, ex, Cluster(address="auto"))
    assert nodes == ["nnnnnnnnnnnn 10.0.0.1 (2 CPUs, 0 GPUs)"]
    ex.add(Job("convert", "c"), Resources(num_cpus=3))
    with pytest.raises(UsageError, match=r"resources\.convert asks each task for 3 CPUs, 0 GPUs, and no node"):
        on_cluster(fake_ray, ex, Cluster(address="auto"))


def test_a_local_cluster_offers_its_slots_and_the_workers_get_the_drivers_settings(tmp_path, monkeypatch, fake_ray):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("QUANTIZE_NOT_FORWARDED", "x")
    lines: list[str] = []
    ex, runs = executor(tmp_path, monkeypatch, lines)
    ex.add(Job("convert", "c"), Resources())
    cluster = Cluster(address="local", num_cpus=2, resources={"big": 1})
    on_cluster(fake_ray, ex, cluster, max_parallel=3, probe=lambda: "measured")
    opts = fake_ray.opts
    assert (opts["address"], opts["num_cpus"], opts["resources"]) == ("local", 2, {"big": 1, SLOT: 3.0})
    env = opts["runtime_env"]["env_vars"]
    assert env["HF_HUB_OFFLINE"] == "1" and "QUANTIZE_NOT_FORWARDED" not in env and "QUANTIZE_CACHE" in env
    assert lines[1] == "probe     measured" and lines[2].startswith("cluster   1 node(s)")  # the probe before Ray
    assert runs == [True]  # each task takes one of the slots


def test_the_probe_is_a_local_clusters_only(tmp_path, monkeypatch, fake_ray):
    def probe():
        raise AssertionError("probed for a cluster this machine does not run")

    ex, runs = executor(tmp_path, monkeypatch)
    ex.add(Job("convert", "c"), Resources())
    on_cluster(fake_ray, ex, Cluster(address="auto"), probe=probe)
    assert fake_ray.opts["address"] == "auto" and "resources" not in fake_ray.opts and runs == [False]
