"""`quantize sweep SWEEP`: every candidate converted and gated on a Ray cluster, the baseline scored once.

    plan (no Ray yet)   the sweep file, the policy and its suite, the baseline, each recipe read (a bad one is its
                        candidate's exit 2, not the sweep's), and what an earlier run already finished (plan.py)
    one graph on Ray    convert NAME (one per recipe still to convert) ─┐
                        baseline (its scores and top-k into the cache) ─┴→ gate NAME (one per candidate)
                        every task submitted at once, a gate with its conversion's and the baseline's ObjectRefs
                        as arguments: Ray starts it when both are done, places each task where its resources are
                        free (max_parallel: a resource of the local cluster's, one per task), and runs a task whose
                        worker died again up to `max_retries` times. Each is an ordinary `quantize run` or gate in
                        a fresh worker process (max_calls=1) with torch at the task's num_cpus threads; the driver
                        only collects the results as they come, and says each attempt's start from the start mark
                        it writes (a thread looking at the state folder every second, not Ray's state): the
                        executor, the connection and the resource checks are quantize/cluster's, as search's are
    at the end          OUTPUT/sweep-NAME/sweep.json (SweepRecord: every task, attempt, node, exit), the report
                        (as `quantize report` draws it) in OUTPUT/sweep-NAME/report, a summary table

The cache ($QUANTIZE_CACHE) and the outputs must be on a path every node sees: this machine's disk for a local
cluster, a shared filesystem for a real one (docs/sweep.md). The driver hands the tasks its cache path.
Exit code: the worst candidate's, 0 pass < 1 rejected or inconclusive < 2 bad input < 3 failure.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantize import records
from quantize.checkpoint import ggufs
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.loader import resolve_model
from quantize.cluster.connect import import_ray, on_cluster
from quantize.cluster.executor import Executor, Track, say_to_stderr, state_folder
from quantize.cluster.resources import gate_gpus
from quantize.cluster.spec import SLOT, Cluster, Resources
from quantize.config import validate
from quantize.convert.dtypes import machine_bf16_speedup
from quantize.cost import bounds
from quantize.errors import EXIT_OK, EXIT_RUNTIME, UsageError
from quantize.flows.gate import check_target, open_policy
from quantize.gates.render import failed_rules
from quantize.records import (
    AttemptRecord,
    CandidateRecord,
    PlannedCandidate,
    PlannedTask,
    SweepPlan,
    SweepRecord,
    SweepTaskRecord,
)
from quantize.report.collect import collect, report_suite
from quantize.report.render import write_report
from quantize.sweep.plan import Candidate, candidates, settle_done, tasks_of, write_cells
from quantize.sweep.spec import MAX_PARALLEL, SweepSpec, load_sweep
from quantize.sweep.tasks import TaskSpec, execute
from quantize.tables import printable


def _graph(
    ex: Executor, spec: SweepSpec, plan: Plan, clean: bool
) -> tuple[Track | None, dict[int, tuple[Track | None, Track | None]]]:
    """The baseline's track and each candidate's (convert, gate), keyed by its place in plan.candidates (a refused
    candidate may carry another's name: its file's)."""
    per: dict[int, tuple[Track | None, Track | None]] = {}
    baseline = str(plan.baseline)
    todo = [tasks_of(spec, c, baseline, clean) for c in plan.candidates]
    base = None
    if any(g is not None for _, g in todo):
        base = ex.add(TaskSpec(kind="baseline", policy=spec.policy, baseline=baseline), plan.baseline_resources)
    for i, (conv, gate) in enumerate(todo):
        c = ex.add(conv, spec.resources.convert) if conv else None
        per[i] = (c, ex.add(gate, plan.gate, after=[base, c]) if gate else None)
    return base, per


@dataclass
class Plan:
    """Everything settled before Ray is imported."""

    spec: SweepSpec
    sha256: str
    path: str
    policy: str  # its name
    baseline: Path
    candidates: list[Candidate]
    gate: Resources  # the gate tasks' resources, GPUs filled in from the suite
    baseline_resources: Resources  # the baseline task's (default: a gate's)

    @property
    def home(self) -> Path:
        return self.spec.home


def plan_sweep(path: str | Path, address: str | None = None, max_parallel: int | None = None) -> Plan:
    """The sweep file with the command line's overrides, its policy and baseline checked (a bad one: exit 2 for the
    whole sweep), and its candidates (a bad one: exit 2 for that candidate only)."""
    spec, sha = load_sweep(path)
    if address is not None:
        spec.cluster = validate(Cluster, {"address": address}, "--address", "cluster address")
    if max_parallel is not None:
        if not 0 <= max_parallel <= MAX_PARALLEL:  # the file's own bounds
            raise UsageError(
                f"--max-parallel {max_parallel}: give 0 (as the resources allow) or a count of at most {MAX_PARALLEL:,}"
            )
        spec.max_parallel = max_parallel
    if spec.max_parallel and spec.cluster.address != "local":
        raise UsageError(
            f"max_parallel = {spec.max_parallel} caps the tasks of a local cluster (a resource it starts with); the "
            f"cluster at {spec.cluster.address} places tasks by the resources they ask for: set max_parallel to 0 and "
            "raise resources.KIND.num_cpus, or give the tasks a custom resource its nodes offer (resources.KIND."
            "resources)"
        )

    policy, suite = open_policy(spec.policy)
    baseline = resolve_model(spec.model)
    check_target(baseline, "the sweep's model is its baseline: a checkpoint folder")
    cands = candidates(spec)
    settle_done(cands, policy, suite, baseline)
    gate, base = spec.resources.gate, spec.resources.baseline or spec.resources.gate
    gate, base = (
        r.model_copy(update={"num_gpus": gate_gpus(suite)}) if r.num_gpus is None else r for r in (gate, base)
    )
    return Plan(spec, sha, str(path), policy.name, baseline, cands, gate, base)


def probe() -> str:
    """The bf16 timing, taken here before any task shares the cores and kept for this boot, so the dtype suggestion
    each conversion records is an idle machine's (convert/dtypes.suggestion; it never chooses the dtype): a local
    cluster that will convert takes it before it starts (cluster/connect.on_cluster)."""
    speedup, now = machine_bf16_speedup()
    return f"bf16 matmuls {speedup:.2f}x float32 on this machine ({'measured now' if now else 'measured earlier'})"


def run_sweep(
    path: str | Path,
    address: str | None = None,
    max_parallel: int | None = None,
    clean: bool = False,
    say: Callable[[str], None] | None = None,
) -> SweepRecord:
    """Plan, run the graph, write sweep.json and the report (module docstring). `say` gets the progress lines
    (default: stderr), one at a time, from the driver's thread or its start-mark watcher."""
    say = say or say_to_stderr("sweep")
    plan = plan_sweep(path, address, max_parallel)
    spec = plan.spec
    ray = import_ray()  # before anything is written
    started, t0 = dt.datetime.now(dt.UTC), time.monotonic()
    state = state_folder(plan.home / "state")
    for c in plan.candidates:
        if c.error:
            say(f"refused   {printable(c.name)} (exit 2): {c.error}")
        elif c.verdict is not None:
            say(f"skipped   {c.name}: converted and gated in an earlier run ({c.verdict.verdict})")
        for note in c.notes:
            say(f"note      {c.name}: {note}")
    write_cells(plan.candidates)
    ex = Executor(state, spec.max_retries, say, execute)
    _, per = _graph(ex, spec, plan, clean)
    nodes: list[str] = []
    if ex.tracks:  # nothing left to do: no cluster to start
        converts = any(t.task.kind == "convert" for t in ex.tracks)
        nodes = on_cluster(ray, ex, spec.cluster, spec.max_parallel, probe if converts else None)
    record = _record(plan, nodes, ex, per, time.monotonic() - t0, started)
    record = _report(record, plan.home, spec)
    records.write(state / "sweep.json", record)  # this run's, kept beside its logs
    records.write(plan.home / "sweep.json", record)
    return record


def sweep_plan(
    path: str | Path, address: str | None = None, max_parallel: int | None = None, clean: bool = False
) -> SweepPlan:
    """`quantize sweep FILE --plan`: the plan of `run_sweep` with the same arguments, without Ray."""
    return describe(plan_sweep(path, address, max_parallel), clean)


def describe(plan: Plan, clean: bool = False) -> SweepPlan:
    """What `run_sweep` would run for this plan: each candidate's folder and what it still needs, and the graph's
    tasks with their inputs and resources. Nothing is written and Ray is not imported."""
    ex = Executor(plan.home / "state", plan.spec.max_retries, lambda line: None, execute)
    _, per = _graph(ex, plan.spec, plan, clean)
    slot = {SLOT: 1.0} if plan.spec.max_parallel else {}
    tasks = [
        PlannedTask(
            task=t.task.label,
            kind=t.task.kind,
            candidate=t.task.candidate,
            after=[a.task.label for a in t.after],
            resources=t.resources.model_dump(exclude_none=True, exclude={"resources"})
            | ({"resources": t.resources.resources | slot} if t.resources.resources or slot else {}),
        )
        for t in ex.tracks
    ]
    cands = []
    for i, c in enumerate(plan.candidates):
        conv, gate = per.get(i, (None, None))
        todo = "refused" if c.error else "done" if c.verdict else "convert and gate" if conv else "gate"
        cands.append(
            PlannedCandidate(
                name=c.name,
                source=c.source,
                checkpoint=str(c.checkpoint) if c.checkpoint else None,
                recipe=c.recipe,
                matrix=c.cell,
                todo=todo,
                message=c.error
                or (f"gated in an earlier run: {c.verdict.verdict}" if c.verdict else "; ".join(c.notes)),
            )
        )
        assert todo in ("refused", "done") or gate is not None
    return SweepPlan(
        spec=plan.path,
        spec_sha256=plan.sha256,
        home=str(plan.home),
        address=plan.spec.cluster.address,
        policy=plan.policy,
        baseline=str(plan.baseline),
        candidates=cands,
        tasks=tasks,
    )


def _attempts(t: Track, state: Path) -> list[AttemptRecord]:
    out = []
    for pid, m in sorted(t.starts.items(), key=lambda kv: kv[1].started):
        fin = t.outcome is not None and t.outcome.pid == pid
        out.append(
            AttemptRecord(
                **m.model_dump(exclude={"task"}),
                outcome="finished" if fin else "died",
                seconds=t.outcome.seconds if fin and t.outcome else None,
                log=str(state / f"{t.task.slug}.{pid}.log"),
            )
        )
    return out


def _task_record(t: Track, state: Path) -> SweepTaskRecord:
    return SweepTaskRecord(
        task=t.task.label,
        kind=t.task.kind,
        candidate=t.task.candidate,
        state=t.state if t.state in ("done", "failed", "not run") else "not run",
        exit_code=t.exit_code,
        message=t.message,
        attempts=_attempts(t, state),
        record=t.outcome.record if t.outcome else None,
        scored=t.outcome.scored if t.outcome else [],
    )


def _candidate_record(c: Candidate, conv: Track | None, gate: Track | None) -> CandidateRecord:

    verdict = c.verdict
    if gate is not None and gate.outcome is not None and gate.outcome.record:
        verdict = records.read(records.Verdict, Path(gate.outcome.record))
    code, message = 0, ""
    if c.error:
        code, message = 2, c.error
    elif c.verdict is not None:
        code, message = c.verdict.exit_code, "done in an earlier run"
    else:
        for t in (conv, gate):
            if t is not None and t.state in ("failed", "not run"):
                code, message = t.exit_code if t.exit_code is not None else EXIT_RUNTIME, t.message
                break
        else:
            code = verdict.exit_code if verdict else EXIT_RUNTIME
            message = gate.message if gate else ""
    tracks = [t for t in (conv, gate) if t is not None]
    seconds = [t.outcome.seconds for t in tracks if t.outcome]
    nodes = sorted({m.node[:12] for t in tracks for m in t.starts.values()})
    bits = _bits(c.checkpoint)
    return CandidateRecord(
        name=c.name,
        source=c.source,
        checkpoint=str(c.checkpoint) if c.checkpoint else None,
        bits_per_weight=bits.bits_per_weight if bits else None,
        total_bytes=bits.total_bytes if bits else None,
        matrix=c.cell,
        verdict=verdict.verdict if verdict else None,
        failed_rules=failed_rules(verdict) if verdict else [],
        exit_code=code,
        message=message,
        wall_seconds=round(sum(seconds), 1) if seconds else None,
        nodes=nodes,
    )


def _written(ckpt: Path | None) -> bool:
    """`ckpt` holds a conversion's output: a safetensors checkpoint (config.json) or a GGUF (a `method: gguf`
    recipe's folder: model.gguf beside its card and quantize.json, ggufs.find)."""
    if ckpt is None or (ckpt / "config.json").is_file():
        return ckpt is not None
    try:
        return ggufs.find(ckpt) is not None
    except UsageError:
        return False


def _bits(ckpt: Path | None) -> Any:
    """The checkpoint's BitsReport (a GGUF's from its header), None when there is none or it does not read."""
    if not _written(ckpt):
        return None

    try:
        return bits_report(ckpt)
    except UsageError:
        return None


def _record(
    plan: Plan,
    nodes: list[str],
    ex: Executor,
    per: dict[int, tuple[Track | None, Track | None]],
    seconds: float,
    started: dt.datetime,
) -> SweepRecord:
    cand_records = [_candidate_record(c, *per.get(i, (None, None))) for i, c in enumerate(plan.candidates)]
    return SweepRecord(
        created=started.isoformat(timespec="seconds"),
        spec=plan.path,
        spec_sha256=plan.sha256,
        resolved=plan.spec.model_dump(mode="json"),
        address=plan.spec.cluster.address,
        nodes=nodes,
        policy=plan.policy,
        baseline=str(plan.baseline),
        candidates=cand_records,
        tasks=[_task_record(t, ex.state) for t in ex.tracks],
        wall_seconds=round(seconds, 1),
        report=None,
        exit_code=max([c.exit_code for c in cand_records], default=EXIT_OK),
    )


def _report(record: SweepRecord, home: Path, spec: SweepSpec) -> SweepRecord:
    """The report over every candidate that has a checkpoint, with the baseline and the policy's verdicts, as
    `quantize report` draws it; a report that cannot be drawn is a note, not a lost sweep."""

    folders = [Path(c.checkpoint) for c in record.candidates if c.checkpoint and _written(Path(c.checkpoint))]
    out = home / "report"
    try:
        suite = report_suite(None, spec.policy)
        entries = collect(folders, suite, Path(record.baseline), spec.policy, bounds.HARDWARE["h100-sxm"])
        write_report(entries, out, "bytes", suite, "h100-sxm")
    except UsageError as e:
        return record.model_copy(update={"notes": [*record.notes, f"the report was not drawn: {e}"]})
    return record.model_copy(update={"report": str(out)})
