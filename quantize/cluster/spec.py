"""The cluster and resource schemas of a sweep file and a search recipe (`cluster:`, `resources:`): where the tasks
run and what each kind of task asks the cluster for. Validated like a recipe (pydantic, `extra="forbid"`): every
error names the field and what to do, before Ray is imported.

    resources:
      convert: {num_cpus: 2}         # per task; torch gets num_cpus threads
      gate: {num_cpus: 2, num_gpus: 0, memory: 8GiB}
      baseline: {num_cpus: 2}        # every gate waits for it; default: as a gate
    cluster: {address: local, num_cpus: 2}   # local: a cluster of one started here; auto: the running one;
                                             # ray://HOST:10001 or HOST:6379: that cluster
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9}
# the forms cluster.address takes, matched whole (ASCII host names and ports: no whitespace, no newline)
ADDRESS = re.compile(r"local|auto|(?P<client>ray://)?[A-Za-z0-9][A-Za-z0-9.\-]{0,252}(?::(?P<port>[0-9]{1,5}))?")
SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
SLOT = "quantize_sweep_slot"  # max_parallel on a local cluster: it offers that many, each task takes one


def parse_bytes(value: int | float | str) -> int:
    """A memory size: bytes as a number, or a number with a unit (8GiB, 512MiB, 2GB)."""
    if isinstance(value, bool):
        raise ValueError("a memory size is bytes or a number with a unit like 8GiB, not true/false")
    if isinstance(value, int | float):
        n = float(value)
    else:
        m = SIZE.match(value)
        if not m or m.group(2).lower() not in UNITS:
            raise ValueError(f"{value!r} is not a memory size; write bytes, or a number with KiB, MiB, GiB, GB, ...")
        n = float(m.group(1)) * UNITS[m.group(2).lower()]
    if not 0 <= n <= 2**50:
        raise ValueError(f"{value!r} is not a plausible memory size for one task")
    return int(n)


CUSTOM = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,63}")
RAY_OWN = {"CPU", "GPU", "memory", "object_store_memory"}


def _custom_resources(r: dict[str, float]) -> dict[str, float]:
    """Custom Ray resources: names of letters, digits, `_` and `-` (not Ray's own, which have fields, nor ours, like
    SLOT), amounts from 0 to a million."""
    for name, amount in r.items():
        if not CUSTOM.fullmatch(name) or name in RAY_OWN or name.startswith("quantize_"):
            raise ValueError(
                f"{name!r} is not a custom resource's name: letters, digits, _ and - (CPU, GPU and memory have "
                "fields of their own; quantize_* are the sweep's)"
            )
        if not 0 < amount <= 1e6:
            raise ValueError(f"{name}: {amount} is not an amount of a resource; give a number above 0")
    return r


class Resources(BaseModel):
    """What one task of a kind asks the cluster for (Ray's resources); torch runs num_cpus threads in it."""

    model_config = ConfigDict(extra="forbid")

    num_cpus: int = Field(1, ge=1, le=1024, description="CPUs per task; also torch's thread count in it")
    num_gpus: float | None = Field(
        None, ge=0, le=64, description="GPUs per task; gate default: the suite's vLLM tensor × data parallel, else 0"
    )
    memory: int | None = Field(None, description="bytes, or a size like 8GiB; none: Ray does not reserve memory")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources per task, e.g. {big_memory: 1}: a node must offer them"
    )

    @field_validator("resources")
    @classmethod
    def _custom(cls, r: dict[str, float]) -> dict[str, float]:
        return _custom_resources(r)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, v: int | float | str | None) -> int | None:
        return None if v is None else parse_bytes(v)


class TaskResources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    convert: Resources = Field(default_factory=Resources)
    gate: Resources = Field(default_factory=Resources)
    baseline: Resources | None = Field(
        None, description="the baseline's full scoring (every gate waits for it); default: as a gate"
    )


class Cluster(BaseModel):
    """Where the tasks run: `local` starts a cluster of one on this machine with `num_cpus` CPUs (default: all of
    them) and stops it at the end; `auto` joins the cluster `ray start` runs here; an address joins that one."""

    model_config = ConfigDict(extra="forbid")

    address: str = "local"
    num_cpus: int | None = Field(None, ge=1, le=4096, description="for local: CPUs the cluster of one offers")
    resources: dict[str, float] = Field(
        default_factory=dict, description="for local: custom resources the cluster of one offers, e.g. {big_memory: 2}"
    )

    @field_validator("resources")
    @classmethod
    def _custom(cls, r: dict[str, float]) -> dict[str, float]:
        return _custom_resources(r)

    @field_validator("address")
    @classmethod
    def _address(cls, a: str) -> str:
        m = ADDRESS.fullmatch(a)
        port = m and m.group("port")
        if not m or (a not in ("local", "auto") and not (m.group("client") or port)) or (port and int(port) > 65535):
            raise ValueError(
                "give local (a cluster of one here), auto (the one `ray start` runs here), "
                "ray://HOST:10001 (Ray Client) or HOST:6379 (the head's GCS)"
            )
        return a

    @model_validator(mode="after")
    def _local_only(self) -> Cluster:
        if self.num_cpus is not None and self.address != "local":
            raise ValueError(
                f"cluster.num_cpus sizes a local cluster; the cluster at {self.address} has its own CPUs: remove it"
            )
        if self.resources and self.address != "local":
            raise ValueError(
                f"cluster.resources are a local cluster's; the cluster at {self.address} offers its own (`ray start "
                "--resources`): remove them"
            )
        return self
