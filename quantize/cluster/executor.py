"""The executor: a graph of tasks submitted to Ray at once, each run in a fresh worker process by a function the
caller gives, and their results collected as they come. It knows no kind of task: a task is anything with a label,
a slug and a kind (the sweep's TaskSpec, quantize/sweep/tasks.py), and `work(task, state, node, host, threads)` is
what a worker runs on it (the sweep's `execute`), returning its Outcome.

    submitted           every task at once, inputs first: a task takes its inputs' ObjectRefs as arguments, so Ray
                        starts it when they are done and places it where its resources are free (SLOT: one per task
                        on a local cluster that caps them); a task whose worker died runs again up to `max_retries`
                        times; a task given a failed input runs nothing (`not_run`)
    while they run      each attempt writes its start mark first (`mark_start`: STATE/SLUG.PID.start), and a driver
                        thread lists the state folder every WATCH_SECONDS to say each start and retry (files, never
                        Ray's state API); the driver only waits for results (`ray.wait`, no timeout)
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from quantize.cluster.spec import SLOT, Resources
from quantize.errors import EXIT_OK, EXIT_RUNTIME
from quantize.io import write_text_atomic
from quantize.tables import printable, printable_lines

WATCH_SECONDS = 1.0  # how often the driver looks for new start marks while tasks run (a directory listing)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")  # set to each task's num_cpus


class Task(Protocol):
    """What the executor reads of a task: its label (progress lines, start marks), its slug (file names) and its
    kind (the `resources.KIND` it asks for)."""

    @property
    def label(self) -> str: ...

    @property
    def slug(self) -> str: ...

    @property
    def kind(self) -> str: ...


class Outcome(BaseModel):
    """What a task's worker returns to the driver."""

    model_config = ConfigDict(extra="forbid")

    pid: int
    exit_code: int
    message: str
    record: str | None  # the file the task wrote
    scored: list[str]  # identities scored in full here
    seconds: float
    threads: int
    not_run: bool = False  # an input (a task whose result it takes) failed: nothing was run


Work = Callable[[Any, Path, str, str, int], Outcome]  # (task, state folder, node, host, threads) -> its outcome


def not_run(task: Task) -> Outcome:
    """A task whose input failed: no start mark, no log; the driver says which input."""
    return Outcome(
        pid=os.getpid(),
        exit_code=EXIT_RUNTIME,
        message="not run",
        record=None,
        scored=[],
        seconds=0.0,
        threads=0,
        not_run=True,
    )


class StartMark(BaseModel):
    """TASK.PID.start: what an attempt writes first, so the driver can say where it runs and tell a retry."""

    model_config = ConfigDict(extra="forbid")

    task: str  # the task's label
    pid: int
    node: str
    host: str
    threads: int
    started: str


def mark_start(state: Path, task: Task, node: str, host: str, threads: int) -> None:

    pid = os.getpid()
    mark = StartMark(
        task=task.label,
        pid=pid,
        node=node,
        host=host,
        threads=threads,
        started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    write_text_atomic(state / f"{task.slug}.{pid}.start", mark.model_dump_json() + "\n")


def _in_worker(work: Work, task: Task, state: str, threads: int, *inputs: Outcome) -> Outcome:
    """The body of every Ray task: where it runs, then `work` on the task. `inputs` are the results of the tasks it
    takes (Ray passes them once they are done); one that failed: nothing is run."""
    if any(i.exit_code != EXIT_OK for i in inputs):
        return not_run(task)
    import ray

    node = ray.get_runtime_context().get_node_id()
    return work(task, Path(state), node, ray.util.get_node_ip_address(), threads)


@dataclass
class Track:
    """A task of this run, as the driver follows it."""

    task: Task
    resources: Resources
    after: list[Track] = field(default_factory=list)  # the tasks whose results it takes
    ref: Any = None  # the Ray object ref once submitted
    state: str = "waiting"  # waiting, submitted, done, failed, not run
    outcome: Outcome | None = None
    message: str = ""
    exit_code: int | None = None
    starts: dict[int, StartMark] = field(default_factory=dict)  # pid -> its attempt's start mark


class Executor:
    """A graph of tasks (module docstring): tasks added with the tasks whose results they take, then submitted to
    Ray at once, inputs first, each run by `work` in its worker; the driver collects the results as they come.
    While they run, a thread reads the attempts' start marks as they appear (every `watch_seconds`, and before
    each result is taken) for the `running` and `retried` lines; it never decides what may start. `say` gets one
    line at a time, from either thread, never two at once."""

    def __init__(
        self,
        state: Path,
        max_retries: int,
        say: Callable[[str], None],
        work: Work,
        watch_seconds: float = WATCH_SECONDS,
    ):
        self.state, self._say, self.work = state, say, work
        self.max_retries, self.watch_seconds = max_retries, watch_seconds
        self.tracks: list[Track] = []
        self._lock = threading.RLock()  # the start marks read, and the lines said, by one thread at a time
        self._seen: set[str] = set()  # start marks already read (each is written whole, once)

    def say(self, line: str) -> None:
        with self._lock:
            self._say(line)

    def add(self, task: Task, resources: Resources, after: list[Track | None] | None = None) -> Track:
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
            self.work, t.task, str(self.state), r.num_cpus, *inputs
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
            if isinstance(e, ray.exceptions.RayTaskError):  # the function raised (retried only when its worker dies)
                cause = getattr(e, "cause", None)  # the exception the function raised, without Ray's traceback
                said = f"{type(cause).__name__}: {cause}" if cause is not None else (str(e).strip() or "?")
                return self._failed(
                    t, f"failed: the task raised in its worker ({printable(said.splitlines()[-1][:300])})"
                )
            first = printable(str(e).strip().splitlines()[0][:300]) if str(e).strip() else type(e).__name__
            died = f"its worker died {self.max_retries + 1} times"
            return self._failed(t, f"failed: {died} ({type(e).__name__}: {first})")
        if not isinstance(outcome, Outcome):  # a task function of ours returns an Outcome: anything else is our bug
            return self._failed(t, f"failed: the task returned {type(outcome).__name__}, not an Outcome (a bug)")
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

    def _failed(self, t: Track, message: str) -> None:
        t.state, t.exit_code, t.message = "failed", EXIT_RUNTIME, message
        self.say(f"failed    {t.task.label} (exit {t.exit_code}): {t.message}")

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


def state_folder(root: Path) -> Path:
    """This run's folder of start marks and logs, below `root`."""
    state = root / f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{os.getpid()}"
    state.mkdir(parents=True, exist_ok=True)
    return state


def say_to_stderr(command: str) -> Callable[[str], None]:
    """Progress lines on stderr, each as `quantize COMMAND: LINE`, control characters escaped (a line names
    users' files and quotes task messages: a name holding an escape sequence must not drive the terminal); a
    message's own line breaks are kept, each line after the first marked as its continuation (`printable_lines`)."""
    return lambda line: print(f"quantize {command}: {printable_lines(line)}", file=sys.stderr, flush=True)
