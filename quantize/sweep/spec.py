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
imported or any model loads. `resources:` and `cluster:` are quantize/cluster/spec.py's, as a search recipe's are.
"""

from __future__ import annotations

import os
import re
from itertools import islice
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantize.cluster.spec import Cluster, TaskResources
from quantize.config import beside_repo, load_yaml
from quantize.errors import UsageError
from quantize.names import PathPart, PathText, checked

MAX_CANDIDATES = 1000  # recipes (after globs) and checkpoints, each; one conversion is minutes to hours
MAX_CELLS = 256  # a matrix's cells (base recipes × every combination of the values): each one is a conversion
MAX_VALUES = 64  # values of one matrix field


MAX_PARALLEL = 10_000  # tasks submitted at once, at most (a file's `max_parallel:` or --max-parallel)


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
            # equal as Python compares them, a boolean apart from a number (a field here has no type yet: a number's
            # 1 is not `true`); plan.cells compares each cell's recipe as the recipe model reads it (`symmetric:
            # [true, 1]`), once the base recipes are read
            pairs = ((a, b) for i, a in enumerate(values) for b in values[:i])
            if any(a == b and isinstance(a, bool) == isinstance(b, bool) for a, b in pairs):
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
    max_parallel: int = Field(
        0, ge=0, le=MAX_PARALLEL, strict=True, description="tasks submitted at once; 0: as the resources allow"
    )
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
    checkpoints, output and a model folder relative to the current folder (as a recipe's `model:` is), made
    absolute here: a task runs in its worker's working folder, which on a cluster the driver joined (`address:
    auto`) is the folder `ray start` ran in, so a relative path sent it to write (and gate) elsewhere than the
    driver reads."""
    spec, sha = load_yaml(path, SweepSpec, "sweep", "see sweeps/default.yaml")
    if spec.name is None:
        spec.name = checked(
            Path(path).stem, f"sweep {path}: its name (the file's, as it sets no `name:`)", "set `name:` in it"
        )
    spec.policy = beside_repo(path, spec.policy)
    spec.output = _absolute(spec.output)
    spec.checkpoints = [_absolute(c) for c in spec.checkpoints]  # as written, below this folder (`a/` kept)
    if spec.model is not None and Path(spec.model).exists():  # a folder here (else a name resolve_model refuses)
        spec.model = _absolute(spec.model)
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


def _absolute(path: str) -> str:
    """`path` below the current folder where it is relative, otherwise as written (a trailing `/` kept: a message
    naming a folder listed twice shows both spellings)."""
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


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
