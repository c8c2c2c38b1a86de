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
                        it writes (a thread looking at the state folder every WATCH_SECONDS, not Ray's state)
    at the end          OUTPUT/sweep-NAME/sweep.json (SweepRecord: every task, attempt, node, exit), the report
                        (as `quantize report` draws it) in OUTPUT/sweep-NAME/report, a summary table

The cache ($QUANTIZE_CACHE) and the outputs must be on a path every node sees: this machine's disk for a local
cluster, a shared filesystem for a real one (docs/sweep.md). The driver hands the tasks its cache path.
Exit code: the worst candidate's, 0 pass < 1 rejected or inconclusive < 2 bad input < 3 failure.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantize import records
from quantize.errors import EXIT_OK, EXIT_RUNTIME, UsageError
from quantize.records import (
    AttemptRecord,
    CandidateRecord,
    PlannedCandidate,
    PlannedTask,
    SweepPlan,
    SweepRecord,
    SweepTaskRecord,
)
from quantize.sweep.plan import Candidate, candidates, settle_done, tasks_of, write_cells
from quantize.sweep.spec import Cluster, Resources, SweepSpec, TaskResources, load_sweep
from quantize.sweep.tasks import THREAD_VARIABLES, Outcome, StartMark, TaskSpec

SLOT = "quantize_sweep_slot"  # max_parallel on a local cluster: it offers that many, each task takes one
# what every task's worker gets from the driver's environment: the shared cache, offline mode
FORWARDED = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "TOKENIZERS_PARALLELISM", "QUANTIZE_REREAD_WEIGHTS")
WATCH_SECONDS = 1.0  # how often the driver looks for new start marks while tasks run (a directory listing)


def _in_worker(task: TaskSpec, state: str, threads: int, *inputs: Outcome) -> Outcome:
    """The body of every Ray task: where it runs, then the task itself (quantize/sweep/tasks.py). `inputs` are the
    results of the tasks it takes (Ray passes them once they are done); one that failed: nothing is run."""
    from quantize.sweep.tasks import execute, not_run

    if any(i.exit_code != EXIT_OK for i in inputs):
        return not_run(task)
    import ray

    node = ray.get_runtime_context().get_node_id()
    return execute(task, Path(state), node, ray.util.get_node_ip_address(), threads)


@dataclass
class Track:
    """A task of this run, as the driver follows it."""

    task: TaskSpec
    resources: Resources
    after: list[Track] = field(default_factory=list)  # the tasks whose results it takes
    ref: Any = None  # the Ray object ref once submitted
    state: str = "waiting"  # waiting, submitted, done, failed, not run
    outcome: Outcome | None = None
    message: str = ""
    exit_code: int | None = None
    starts: dict[int, StartMark] = field(default_factory=dict)  # pid -> its attempt's start mark


def gate_gpus(suite: Any) -> float:
    """GPUs a gate task needs by default: what its suite's vLLM engine asks (tensor × data parallel), else none."""
    v = suite.suite.vllm
    return float(v.tensor_parallel_size * v.data_parallel_size) if suite.suite.backend.value == "vllm" and v else 0.0


def _import_ray() -> Any:
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


class Executor:
    """The sweep's graph (module docstring): tasks added with the tasks whose results they take, then submitted to
    Ray at once, inputs first; the driver collects the results as they come. While they run, a thread reads the
    attempts' start marks as they appear (every `watch_seconds`, and before each result is taken) for the
    `running` and `retried` lines; it never decides what may start. `say` gets one line at a time, from either
    thread, never two at once."""

    def __init__(self, state: Path, max_retries: int, say: Callable[[str], None], watch_seconds: float = WATCH_SECONDS):
        self.state, self._say = state, say
        self.max_retries, self.watch_seconds = max_retries, watch_seconds
        self.tracks: list[Track] = []
        self._lock = threading.RLock()  # the start marks read, and the lines said, by one thread at a time
        self._seen: set[str] = set()  # start marks already read (each is written whole, once)

    def say(self, line: str) -> None:
        with self._lock:
            self._say(line)

    def add(self, task: TaskSpec, resources: Resources, after: list[Track | None] | None = None) -> Track:
        t = Track(task, resources, [a for a in after or [] if a is not None])
        self.tracks.append(t)
        self.say(
            f"queued    {task.label}" + (f" (after {', '.join(a.task.label for a in t.after)})" if t.after else "")
        )
        return t

    def _submit(self, ray: Any, remote: Any, t: Track, slots: bool) -> None:
        r = t.resources
        opts: dict[str, Any] = {
            "num_cpus": r.num_cpus,
            "num_gpus": r.num_gpus or 0,
            "max_retries": self.max_retries,
            "retry_exceptions": False,
        }
        if r.memory:
            opts["memory"] = r.memory
        if custom := r.resources | ({SLOT: 1.0} if slots else {}):
            opts["resources"] = custom
        env = {v: str(r.num_cpus) for v in THREAD_VARIABLES}
        inputs = [a.ref for a in t.after]  # Ray resolves them first: the task starts when they are done
        t.ref = remote.options(**opts, runtime_env={"env_vars": env}).remote(
            t.task, str(self.state), r.num_cpus, *inputs
        )
        t.state = "submitted"

    def _read_starts(self) -> None:
        """Say each start mark that appeared since the last read, in the order the attempts started."""
        from pydantic import ValidationError

        with self._lock:
            marks = []
            for f in self.state.glob("*.start"):
                if f.name in self._seen:
                    continue
                try:
                    marks.append(StartMark.model_validate_json(f.read_bytes()))
                except OSError:  # unreadable now (a shared filesystem): read again next time
                    continue
                except ValidationError:  # written whole (atomic), so only a file not ours fails here
                    pass
                self._seen.add(f.name)
            for mark in sorted(marks, key=lambda m: (m.started, m.pid)):
                self._say_start(mark)

    def _say_start(self, mark: StartMark) -> None:
        t = next((t for t in self.tracks if t.task.label == mark.task), None)
        if t is None or mark.pid in t.starts:
            return
        t.starts[mark.pid] = mark
        where = f"node {mark.node[:12]} ({mark.host}, pid {mark.pid}, {mark.threads} threads)"
        if len(t.starts) == 1:
            self.say(f"running   {t.task.label} on {where}")
        else:
            self.say(f"retried   {t.task.label}: attempt {len(t.starts)} on {where} (the worker before it died)")

    def _failed_input(self, t: Track) -> Track | None:
        return next((a for a in t.after if a.state in ("failed", "not run")), None)

    def _finish(self, ray: Any, t: Track) -> None:
        try:
            outcome = ray.get(t.ref)
        except ray.exceptions.RayError as e:  # its worker died more often than max_retries allows, or an input's
            if (dep := self._failed_input(t)) is not None:
                return self._not_run(t, dep)
            t.state, t.exit_code = "failed", EXIT_RUNTIME
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            t.message = f"failed: its worker died {self.max_retries + 1} times ({type(e).__name__}: {first})"
            self.say(f"failed    {t.task.label} (exit {t.exit_code}): {t.message}")
            return None
        if outcome.not_run and (dep := self._failed_input(t)) is not None:
            return self._not_run(t, dep)
        t.outcome = o = outcome
        t.exit_code, t.message = o.exit_code, o.message
        t.state = "done" if o.exit_code in (0, 1) else "failed"  # 1: a gate's rejection is its result
        self.say(
            f"{'done' if t.state == 'done' else 'failed':9} {t.task.label} in {o.seconds:.0f} s"
            f"{'' if t.state == 'done' else f' (exit {o.exit_code})'}: {o.message}"
        )
        return None

    def _not_run(self, t: Track, dep: Track) -> None:
        t.state, t.message = "not run", f"not run: {dep.task.label} failed ({dep.message[:200]})"
        self.say(f"not run   {t.task.label}: {dep.task.label} failed")

    def run(self, ray: Any, slots: bool = False) -> None:
        """Submit every task (inputs first, as added), then collect each result as Ray finishes it; meanwhile a
        thread says each attempt's start as its mark appears."""
        remote = ray.remote(max_calls=1)(_in_worker)  # a fresh worker per task: torch threads, memory
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(stop,), name="quantize-sweep-starts", daemon=True)
        watcher.start()
        try:
            for t in self.tracks:
                self._submit(ray, remote, t, slots)
            pending = {t.ref: t for t in self.tracks}
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)  # blocks until one is done: no timeout, no polling
                self._read_starts()  # a task's start before its result
                for ref in done:
                    self._collect(ray, pending, pending[ref])
        finally:
            stop.set()
            watcher.join()
        self._read_starts()

    def _watch(self, stop: threading.Event) -> None:
        while not stop.wait(self.watch_seconds):
            self._read_starts()

    def _collect(self, ray: Any, pending: dict[Any, Track], t: Track) -> None:
        """`t`'s result, its inputs' first (a task whose input failed is told apart from one that failed)."""
        for a in t.after:
            if a.ref in pending:
                self._collect(ray, pending, a)
        if pending.pop(t.ref, None) is not None:
            self._finish(ray, t)


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
        from quantize.config import validate

        spec.cluster = validate(Cluster, {"address": address}, "--address", "cluster address")
    if max_parallel is not None:
        if max_parallel < 0:
            raise UsageError(f"--max-parallel {max_parallel}: give 0 (as the resources allow) or a positive count")
        spec.max_parallel = max_parallel
    if spec.max_parallel and spec.cluster.address != "local":
        raise UsageError(
            f"max_parallel = {spec.max_parallel} caps the tasks of a local cluster (a resource it starts with); the "
            f"cluster at {spec.cluster.address} places tasks by the resources they ask for: set max_parallel to 0 and "
            "raise resources.KIND.num_cpus, or give the tasks a custom resource its nodes offer (resources.KIND."
            "resources)"
        )
    from quantize.checkpoint.loader import resolve_model
    from quantize.flows.gate import check_target, open_policy

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


def _env() -> dict[str, str]:
    from quantize.cache import shared_path

    return {v: os.environ[v] for v in FORWARDED if v in os.environ} | {"QUANTIZE_CACHE": shared_path()}


def _say(command: str) -> Callable[[str], None]:
    return lambda line: print(f"quantize {command}: {line}", file=sys.stderr, flush=True)


def _state(root: Path) -> Path:
    """This run's folder of start marks and logs, below `root`."""
    state = root / f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{os.getpid()}"
    state.mkdir(parents=True, exist_ok=True)
    return state


def _on_cluster(ray: Any, ex: Executor, cluster: Cluster, max_parallel: int = 0) -> list[str]:
    """Run the executor's tasks on the cluster, from connecting to shutting down; returns its nodes. On a local
    cluster that will convert, the calibration probe is taken first, while nothing shares the cores. What must fit
    is what the tasks of this run ask for (a kind with no task asks for nothing)."""
    kinds = {t.task.kind for t in ex.tracks}
    if cluster.address == "local" and "convert" in kinds:
        ex.say(f"probe     {_probe()}")
    connect(ray, cluster, _env(), max_parallel)
    try:
        nodes = check_fits(ray, {t.task.kind: t.resources for t in ex.tracks})
        ex.say(f"cluster   {len(nodes)} node(s): {'; '.join(nodes)}")
        ex.run(ray, slots=max_parallel > 0)
    finally:
        ray.shutdown()
    return nodes


def run_chains(
    chains: list[tuple[TaskSpec, TaskSpec]],
    cluster: Cluster,
    resources: TaskResources,
    state: Path,
    max_retries: int = 2,
) -> list[str]:
    """Convert-then-gate chains on the cluster (`quantize search` with max_parallel > 1), the baseline scored once
    first beside the conversions; returns what failed, one line each ([] when every chain finished)."""
    ray = _import_ray()
    ex = Executor(_state(state), max_retries, _say("search"))
    baseline = resources.baseline or resources.gate
    base = ex.add(TaskSpec(kind="baseline", policy=chains[0][1].policy, baseline=chains[0][1].baseline), baseline)
    for c, g in chains:
        ex.add(g, resources.gate, after=[base, ex.add(c, resources.convert)])
    _on_cluster(ray, ex, cluster)
    return [f"{t.task.label} (exit {t.exit_code}): {t.message}" for t in ex.tracks if t.state != "done"]


def _probe() -> str:
    """The bf16 timing, taken here before any task shares the cores and kept for this boot, so the dtype suggestion
    each conversion records is an idle machine's (convert/dtypes.suggestion; it never chooses the dtype)."""
    from quantize.convert.dtypes import machine_bf16_speedup

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
    say = say or _say("sweep")
    plan = plan_sweep(path, address, max_parallel)
    spec = plan.spec
    ray = _import_ray()  # before anything is written
    started, t0 = dt.datetime.now(dt.UTC), time.monotonic()
    state = _state(plan.home / "state")
    for c in plan.candidates:
        if c.error:
            say(f"refused   {c.name} (exit 2): {c.error}")
        elif c.verdict is not None:
            say(f"skipped   {c.name}: converted and gated in an earlier run ({c.verdict.verdict})")
    write_cells(plan.candidates)
    ex = Executor(state, spec.max_retries, say)
    _, per = _graph(ex, spec, plan, clean)
    nodes: list[str] = []
    if ex.tracks:  # nothing left to do: no cluster to start
        nodes = _on_cluster(ray, ex, spec.cluster, spec.max_parallel)
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
    ex = Executor(plan.home / "state", plan.spec.max_retries, lambda line: None)
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
                message=c.error or (f"gated in an earlier run: {c.verdict.verdict}" if c.verdict else ""),
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
    from quantize.gates.render import failed_rules

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


def _bits(ckpt: Path | None) -> Any:
    """The checkpoint's BitsReport, None when there is none or it does not read."""
    if ckpt is None or not (ckpt / "config.json").is_file():
        return None
    from quantize.checkpoint.accounting import bits_report

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
    from quantize.cost import bounds
    from quantize.report.collect import collect, report_suite
    from quantize.report.render import write_report

    folders = [
        Path(c.checkpoint) for c in record.candidates if c.checkpoint and (Path(c.checkpoint) / "config.json").is_file()
    ]
    out = home / "report"
    try:
        suite = report_suite(None, spec.policy)
        entries = collect(folders, suite, Path(record.baseline), spec.policy, bounds.HARDWARE["h100-sxm"])
        write_report(entries, out, "bytes", suite, "h100-sxm")
    except UsageError as e:
        return record.model_copy(update={"notes": [*record.notes, f"the report was not drawn: {e}"]})
    return record.model_copy(update={"report": str(out)})
