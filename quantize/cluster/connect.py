"""Connecting to the cluster, or starting a local one, with the environment every worker gets from the driver; and
one executor's run on it, from connecting to shutting down."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from quantize.cache import shared_path
from quantize.cluster.executor import Executor
from quantize.cluster.resources import check_fits
from quantize.cluster.spec import SLOT, Cluster
from quantize.errors import UsageError

# what every task's worker gets from the driver's environment: the shared cache, offline mode
FORWARDED = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "TOKENIZERS_PARALLELISM", "QUANTIZE_REREAD_WEIGHTS")


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "quantize sweep runs on Ray, which is not installed here: pip install 'quantize[cluster]' (make setup "
            "installs it)"
        ) from None
    return ray


def connect(ray: Any, cluster: Cluster, env: dict[str, str], max_parallel: int = 0) -> None:
    import logging

    opts: dict[str, Any] = {"log_to_driver": False, "runtime_env": {"env_vars": env}, "logging_level": logging.ERROR}
    if cluster.address == "local":
        opts |= {"address": "local", "num_cpus": cluster.num_cpus or os.cpu_count(), "include_dashboard": False}
        opts["resources"] = cluster.resources | ({SLOT: float(max_parallel)} if max_parallel else {})
    else:
        opts["address"] = cluster.address
    try:
        ray.init(**opts)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UsageError(
            f"cannot reach the Ray cluster at cluster.address = {cluster.address} ({str(e)[:300]}); start one with "
            "`ray start --head`, correct the address, or use `local`"
        ) from None


def worker_env() -> dict[str, str]:
    """FORWARDED as the driver has them, and the cache's path as every node must see it."""
    return {v: os.environ[v] for v in FORWARDED if v in os.environ} | {"QUANTIZE_CACHE": shared_path()}


def on_cluster(
    ray: Any, ex: Executor, cluster: Cluster, max_parallel: int = 0, probe: Callable[[], str] | None = None
) -> list[str]:
    """Run the executor's tasks on the cluster, from connecting to shutting down; returns its nodes. On a local
    cluster, `probe` (a measurement that wants the cores to itself) is taken and said first, while nothing shares
    them. What must fit is what the tasks of this run ask for (a kind with no task asks for nothing)."""
    if probe is not None and cluster.address == "local":
        ex.say(f"probe     {probe()}")
    connect(ray, cluster, worker_env(), max_parallel)
    try:
        nodes = check_fits(ray, {t.task.kind: t.resources for t in ex.tracks})
        ex.say(f"cluster   {len(nodes)} node(s): {'; '.join(nodes)}")
        ex.run(ray, slots=max_parallel > 0)
    finally:
        ray.shutdown()
    return nodes
