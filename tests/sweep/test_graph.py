"""The sweep's graph as it is handed to the cluster's executor, without Ray: what the sweep plans for a running
cluster, and what its executor runs in each worker. The executor itself is tested over a stand-in for Ray in
tests/cluster/test_executor.py; the real clusters are in test_sweep.py and test_matrix.py."""

from __future__ import annotations

import pytest

from quantize.errors import UsageError
from quantize.sweep import run as sweep_run
from quantize.sweep.tasks import execute


def test_max_parallel_on_a_running_cluster_is_refused_before_ray(lab):
    f = lab.sweep(checkpoints=[lab.tiny], extra="max_parallel: 2\n")
    with pytest.raises(UsageError, match="max_parallel = 2 caps the tasks of a local cluster"):
        sweep_run.plan_sweep(f, address="auto")


class Handed(Exception):
    pass


@pytest.mark.parametrize("converts", [False, True])
def test_the_executor_runs_the_sweeps_tasks_and_probes_only_before_conversions(lab, monkeypatch, converts):
    """Each worker runs the sweep's `execute`; the bf16 probe is handed to the cluster only when a task converts (a
    sweep that only gates has no dtype to suggest)."""
    handed = {}

    def on_cluster(ray, ex, cluster, max_parallel=0, probe=None):
        handed.update(ex=ex, probe=probe, cluster=cluster.address, max_parallel=max_parallel)
        raise Handed

    monkeypatch.setattr(sweep_run, "import_ray", lambda: object())
    monkeypatch.setattr(sweep_run, "on_cluster", on_cluster)
    f = lab.sweep([lab.w4] if converts else [], checkpoints=[] if converts else [lab.tiny], extra="max_parallel: 1\n")
    with pytest.raises(Handed):
        sweep_run.run_sweep(f, say=lambda line: None)
    ex = handed["ex"]
    assert ex.work is execute and (handed["cluster"], handed["max_parallel"]) == ("local", 1)
    assert sorted(t.task.kind for t in ex.tracks) == (
        ["baseline", "convert", "gate"] if converts else ["baseline", "gate"]
    )
    assert handed["probe"] is (sweep_run.probe if converts else None)
