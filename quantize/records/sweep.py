"""OUTPUT/sweep-NAME/sweep.json, written by `quantize sweep` (every task, attempt and candidate), and the plan
`quantize sweep --plan` prints instead (nothing written): the same tasks and candidates before they run."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from quantize.records.base import GateOutcome, Record, Strict

TaskKind = Literal["convert", "baseline", "gate"]


class AttemptRecord(Strict):
    """One run of a task in a worker process: where, and how it ended."""

    pid: int
    node: str  # the Ray node id
    host: str  # the node's address
    started: str
    threads: int  # torch's thread count in the worker (the task's num_cpus)
    outcome: Literal["finished", "died"]  # died: the worker process ended before the task returned
    seconds: float | None  # wall time in the worker; None when it died
    log: str  # the attempt's stdout and stderr


class SweepTaskRecord(Strict):
    task: str  # "baseline", "convert NAME", "gate NAME"
    kind: TaskKind
    candidate: str | None  # None: the baseline
    state: Literal["done", "failed", "skipped", "not run"]  # skipped: its record was complete from an earlier run
    exit_code: int | None  # the command's: 0, 1 (gate rejected), 2 bad input, 3 failure; None: not run
    message: str
    attempts: list[AttemptRecord]
    record: str | None  # what the task wrote: a quantize.json or a gate.json
    scored: list[str]  # identities this task scored in full (not from the cache)


class CandidateRecord(Strict):
    name: str
    source: str  # the recipe file, or the checkpoint folder given
    checkpoint: str | None  # the folder gated (None: no conversion was made)
    bits_per_weight: float | None
    verdict: GateOutcome | None
    failed_rules: list[str]
    exit_code: int  # 0 pass, 1 rejected or inconclusive, 2 bad input, 3 failure
    message: str
    wall_seconds: float | None  # its tasks' worker time in this run (None: nothing ran)
    nodes: list[str]
    total_bytes: int | None = None  # every tensor's bytes (None: no checkpoint)
    matrix: dict[str, Any] | None = None  # a matrix cell's values by recipe field (None: not a cell)


class PlannedTask(Strict):
    task: str  # "baseline", "convert NAME", "gate NAME"
    kind: TaskKind
    candidate: str | None
    after: list[str]  # the tasks whose results it takes (Ray starts it when they are done)
    resources: dict[str, Any]  # what it asks the cluster for: num_cpus, num_gpus, memory, custom resources


class PlannedCandidate(Strict):
    name: str
    source: str
    checkpoint: str | None  # its output folder (None: refused before it had one)
    recipe: str | None  # the recipe file converted (a matrix cell's: written when it runs)
    matrix: dict[str, Any] | None  # a matrix cell's values by recipe field
    todo: Literal["convert and gate", "gate", "done", "refused"]
    message: str  # why refused; the earlier verdict when done; why its gate.json is not taken as done (gated again)


class SweepPlan(Record):
    """`quantize sweep FILE --plan`: what the sweep would run, found without Ray (nothing is written)."""

    WHAT: ClassVar[str] = "sweep plan"

    schema_version: Literal[1] = 1
    spec: str
    spec_sha256: str
    home: str  # OUTPUT/sweep-NAME
    address: str
    policy: str
    baseline: str
    candidates: list[PlannedCandidate]
    tasks: list[PlannedTask]


class SweepRecord(Record):
    """OUTPUT/sweep-NAME/sweep.json: what `quantize sweep` ran, where, and what each candidate came to."""

    WHAT: ClassVar[str] = "sweep record"
    REGENERATE: ClassVar[str] = "run `quantize sweep SWEEP` again (finished candidates are skipped)"

    schema_version: Literal[1] = 1
    created: str
    spec: str
    spec_sha256: str
    resolved: dict[str, Any]
    address: str
    nodes: list[str]  # node id and address of every node alive at the start
    policy: str
    baseline: str
    candidates: list[CandidateRecord]
    tasks: list[SweepTaskRecord]
    wall_seconds: float
    report: str | None  # the report folder (None: it could not be drawn; the reason is in `notes`)
    exit_code: int
    notes: list[str] = Field(default_factory=list)
