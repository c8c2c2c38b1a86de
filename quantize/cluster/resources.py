"""What the tasks ask of the cluster, checked against what it has: a gate's GPUs from its suite, and every kind of
task fitting some node before anything is submitted (Ray would queue a task that fits none for ever)."""

from __future__ import annotations

from typing import Any

from quantize.cluster.spec import Resources
from quantize.errors import UsageError


def gate_gpus(suite: Any) -> float:
    """GPUs a gate task needs by default: what its suite's vLLM engine asks (tensor × data parallel), else none."""
    v = suite.suite.vllm
    return float(v.tensor_parallel_size * v.data_parallel_size) if suite.suite.backend.value == "vllm" and v else 0.0


def check_fits(ray: Any, wanted: dict[str, Resources]) -> list[str]:
    """Every kind of task fits on some node (else Ray would queue it for ever); returns the nodes, as
    "NODE-ID HOST (N CPUs, G GPUs)"."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    shown = [
        f"{n['NodeID'][:12]} {n['NodeManagerAddress']} ({int(n['Resources'].get('CPU', 0))} CPUs, "
        f"{int(n['Resources'].get('GPU', 0))} GPUs)"
        for n in nodes
    ]
    for kind, r in wanted.items():
        fits = [
            n
            for n in nodes
            if n["Resources"].get("CPU", 0) >= r.num_cpus
            and n["Resources"].get("GPU", 0) >= (r.num_gpus or 0)
            and (r.memory is None or n["Resources"].get("memory", 0) >= r.memory)
            and all(n["Resources"].get(k, 0) >= v for k, v in r.resources.items())
        ]
        if not fits:
            raise UsageError(
                f"resources.{kind} asks each task for {r.num_cpus} CPUs, {r.num_gpus or 0} GPUs"
                + (f", {r.memory:,} bytes" if r.memory else "")
                + "".join(f", {v:g} {k}" for k, v in r.resources.items())
                + f", and no node of the cluster has that much ({'; '.join(shown)}): lower resources.{kind}, or "
                "join nodes that have it"
            )
    return shown
