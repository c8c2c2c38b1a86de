"""Sweep files (sweeps/*.yaml): many candidates of one source model, converted and gated on a Ray cluster.

    name: default
    model: null                      # the source and baseline; empty = the embedded default model
    recipes: [recipes/*.yaml]        # paths or globs, beside this file's repository (as a policy's suite is)
    checkpoints: []                  # existing checkpoint folders to gate as they are
    policy: gates/ci.yaml
    output: outputs                  # converted checkpoints go to OUTPUT/<recipe name>; the sweep's own files to
                                     # OUTPUT/sweep-<name>/ (sweep.json, report/, logs/)
    resources:
      convert: {num_cpus: 2}         # per task; torch gets num_cpus threads
      gate: {num_cpus: 2, num_gpus: 0, memory: 8GiB}
      baseline: {num_cpus: 2}      # every gate waits for it; default: as a gate
    cluster: {address: local, num_cpus: 2}   # local: a cluster of one started here; auto: the running one;
                                             # ray://HOST:10001 or HOST:6379: that cluster
    matrix:                          # cells: every combination of the values, applied to each base recipe
      recipes: [recipes/gptq-w4a16-g128.yaml]
      fields: {group_size: [32, 128], calibration.samples: [32, 64]}
    max_parallel: 0                  # tasks submitted at once; 0 = as many as the cluster's resources take
    max_retries: 2                   # a task whose worker died is run again this many times

Validated like a recipe (pydantic, `extra="forbid"`): every error names the field and what to do, before Ray is
imported or any model loads.
"""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantize.config import beside_repo, load_yaml
from quantize.errors import UsageError
from quantize.names import PathPart, PathText, checked

UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9}
# the forms cluster.address takes, matched whole (ASCII host names and ports: no whitespace, no newline)
ADDRESS = re.compile(r"local|auto|(?P<client>ray://)?[A-Za-z0-9][A-Za-z0-9.\-]{0,252}(?::(?P<port>[0-9]{1,5}))?")
MAX_CANDIDATES = 1000  # recipes (after globs) and checkpoints, each; one conversion is minutes to hours
MAX_CELLS = 256  # a matrix's cells (base recipes × every combination of the values): each one is a conversion
MAX_VALUES = 64  # values of one matrix field
SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


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
    """Custom Ray resources: names of letters, digits, `_` and `-` (not Ray's own, which have fields), amounts
    from 0 to a million."""
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


class Matrix(BaseModel):
    """Recipe fields to vary: every combination of `fields`' values, applied to each base recipe, is a candidate
    (a cell) named from its base and its values (sweep/plan.py). A field is a recipe field's dotted path
    (`group_size`, `calibration.samples`), checked against each base recipe's schema before anything runs."""

    model_config = ConfigDict(extra="forbid")

    recipes: list[str] = Field(min_length=1, max_length=MAX_CANDIDATES, description="base recipe files or globs")
    fields: dict[str, list[Any]] = Field(min_length=1, max_length=8, description="dotted recipe field: its values")

    @field_validator("fields")
    @classmethod
    def _fields(cls, fields: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for path, values in fields.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", path):
                raise ValueError(
                    f"{path!r} is not a recipe field's dotted path, e.g. group_size or calibration.samples"
                )
            if not 1 <= len(values) <= MAX_VALUES:
                raise ValueError(f"{path} takes 1 to {MAX_VALUES} values, and {len(values)} were given")
            if len({repr(v) for v in values}) < len(values):
                raise ValueError(f"{path} lists one value twice ({values!r}): list each once")
        return fields

    def cells(self) -> int:
        """Cells per base recipe."""
        n = 1
        for values in self.fields.values():
            n *= len(values)
        return n


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: PathPart | None = Field(None, pattern=r"^[A-Za-z0-9][\w.\-]*$")
    description: str | None = None
    model: str | None = Field(None, description="the source and baseline folder; empty = the embedded default model")
    recipes: list[str] = Field(default_factory=list, max_length=MAX_CANDIDATES, description="recipe files or globs")
    checkpoints: list[str] = Field(
        default_factory=list, max_length=MAX_CANDIDATES, description="existing checkpoint folders to gate"
    )
    policy: str = Field(description="the gate policy every candidate must pass, e.g. gates/ci.yaml")
    output: PathText = Field(
        "outputs", description="OUTPUT/<recipe name> per conversion; OUTPUT/sweep-<name>/ the sweep's"
    )
    matrix: Matrix | None = Field(None, description="recipe fields to vary over base recipes: one candidate per cell")
    resources: TaskResources = Field(default_factory=TaskResources)
    cluster: Cluster = Field(default_factory=Cluster)
    max_parallel: int = Field(0, ge=0, le=10_000, description="tasks submitted at once; 0: as the resources allow")
    max_retries: int = Field(2, ge=0, le=20, description="runs again of a task whose worker died")

    @property
    def home(self) -> Path:
        """OUTPUT/sweep-NAME: sweep.json, the report, each run's logs."""
        return Path(self.output) / f"sweep-{self.name}"

    @model_validator(mode="after")
    def _candidates(self) -> SweepSpec:
        if not self.recipes and not self.checkpoints and self.matrix is None:
            raise ValueError(
                "a sweep needs candidates: list recipe files (or globs) in `recipes:`, checkpoint folders in "
                "`checkpoints:`, or give a `matrix:` of recipe fields over base recipes"
            )
        return self


def load_sweep(path: str | Path) -> tuple[SweepSpec, str]:
    """A sweep file, its paths resolved: recipes (globs expanded, sorted) and the policy beside its repository,
    checkpoints and model as given (relative to the current folder, as a recipe's `model:` is)."""
    spec, sha = load_yaml(path, SweepSpec, "sweep", "see sweeps/default.yaml")
    if spec.name is None:
        spec.name = checked(
            Path(path).stem, f"sweep {path}: its name (the file's, as it sets no `name:`)", "set `name:` in it"
        )
    spec.policy = beside_repo(path, spec.policy)
    spec.recipes = expand_recipes(path, spec.recipes)
    if (m := spec.matrix) is not None:
        m.recipes = expand_recipes(path, m.recipes)
        if (n := len(m.recipes) * m.cells()) > MAX_CELLS:
            raise UsageError(
                f"sweep {path}: matrix has {n:,} cells ({len(m.recipes)} base recipe(s) × "
                + " × ".join(f"{len(v)} {f}" for f, v in m.fields.items())
                + f"); a sweep takes at most {MAX_CELLS}, each one a conversion: list fewer values, or split it"
            )
    return spec, sha


def expand_recipes(sweep_file: str | Path, given: list[str]) -> list[str]:
    """Each entry a path, read beside the sweep file's folder, else its repository (beside_repo); an entry that names
    no file there and holds * ? or [ is a glob over those folders, sorted. A glob that matches nothing, or a path
    that is not there, is kept as given so its candidate is reported, not lost. More than MAX_CANDIDATES in all is
    refused (a glob stops reading its matches there)."""
    here = Path(sweep_file).resolve().parent
    out: list[str] = []
    for entry in given:
        literal = beside_repo(sweep_file, entry)
        if Path(literal).exists() or not any(c in entry for c in "*?["):
            out.append(literal)
            continue
        if Path(entry).is_absolute():
            matches = _glob(Path("/"), entry.lstrip("/"))
        else:
            matches = next((found for base in (here, here.parent) if (found := _glob(base, entry))), [])
        out += matches or [entry]
        if len(out) > MAX_CANDIDATES:
            raise UsageError(
                f"sweep {sweep_file}: `recipes:` names more than {MAX_CANDIDATES:,} files (at {entry}); a sweep "
                "takes at most that many: split it into several sweeps, or narrow the globs"
            )
    return list(dict.fromkeys(out))


def _glob(base: Path, pattern: str) -> list[str]:
    return sorted(str(p) for p in islice(base.glob(pattern), MAX_CANDIDATES + 1))
