"""What one sweep task does in its worker: an ordinary `quantize run` or `quantize gate`, or the baseline's scoring,
as plain functions (no Ray here: the executor, quantize/cluster/executor.py, runs `execute` in a Ray task for the
sweep and for `quantize search`, and the tests call it directly to run the same candidates one after the other).
`convert_and_gate` is the two halves of a candidate in this process, one after the other: what `quantize search`
does for a try; a sweep runs the same halves as two tasks joined by Ray's graph (the gate takes the conversion's and
the baseline's results).

Each attempt leaves two files in the sweep's state folder, named by the task and the worker's pid:
`TASK.PID.start` (the executor's start mark, written first: where it runs, so the driver can say so and tell a retry
from the first run) and `TASK.PID.log` (what the libraries printed). The outcome is returned, never raised: a bad
recipe is exit 2 and a failed conversion exit 3 in the outcome, and the sweep goes on with the other candidates.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantize import records
from quantize.checkpoint.files import weights_sha256
from quantize.checkpoint.loader import default_model_dir, resolve_model
from quantize.cluster.executor import THREAD_VARIABLES, Outcome, mark_start
from quantize.convert.engine import complete_output, convert, tidy_leftovers
from quantize.convert.gguf import source_gguf
from quantize.convert.recipe import FILE_METHODS, load_recipe
from quantize.errors import EXIT_OK, EXIT_RUNTIME, RuntimeFailure, UsageError
from quantize.flows.gate import run_gate, save_verdict, score_baseline, scored_here
from quantize.gates.render import headline
from quantize.io import expand_user
from quantize.quiet import quiet_libraries
from quantize.records import JUNIT_FILE, VERDICT_FILE, RunRecord, TaskKind


class TaskSpec(BaseModel):
    """One task of the sweep's graph, as the driver hands it to a worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: TaskKind
    candidate: str | None = None  # None: the baseline
    policy: str
    baseline: str  # the source model's folder
    model: str | None = None  # convert: the sweep's `model:` as written (None: the default model)
    recipe: str | None = None  # convert: the recipe file
    checkpoint: str | None = None  # convert: the output folder; gate: the candidate's folder
    clean: bool = False  # convert: remove what killed runs left beside the output (as `quantize run --clean`)

    @property
    def label(self) -> str:
        return self.kind if self.candidate is None else f"{self.kind} {self.candidate}"

    @property
    def slug(self) -> str:
        """The task's name in file names: kind, then the candidate (a recipe's name or a folder's)."""
        return self.kind if self.candidate is None else f"{self.kind}-{self.candidate}"


def set_threads(threads: int) -> None:
    """torch's thread count for this worker: the variables before torch is imported (a fresh worker per task),
    and torch's own setting in case it was."""
    for var in THREAD_VARIABLES:
        os.environ[var] = str(threads)
    import torch

    torch.set_num_threads(threads)


def execute(task: TaskSpec, state: Path, node: str = "local", host: str = "localhost", threads: int = 1) -> Outcome:
    """Run one task here; the state folder gets its start mark and its log (module docstring)."""
    state = Path(state)
    mark_start(state, task, node, host, threads)
    pid, t0 = os.getpid(), time.monotonic()
    log_path = state / f"{task.slug}.{pid}.log"
    with open(log_path, "w", encoding="utf-8") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            set_threads(threads)
            code, message, record = RUNNERS[task.kind](task)
        except (UsageError, RuntimeFailure) as e:
            code, message, record = e.exit_code, f"{e.says}: {e}", None
        except Exception as e:  # our bug or the environment's: the others go on; the log has the traceback
            traceback.print_exc()
            code, message, record = EXIT_RUNTIME, f"failed: {type(e).__name__}: {str(e)[:500]}", None

    return Outcome(
        pid=pid,
        exit_code=code,
        message=message,
        record=record,
        scored=scored_here(),
        seconds=round(time.monotonic() - t0, 1),
        threads=threads,
    )


def prepare_recipe(recipe_path: str, model: str | None, output: Path | None = None):
    """A sweep's recipe as it is converted: the sweep's model where the recipe names none (a recipe naming another
    model is refused: its verdict would be against the wrong baseline), written to `output` (None: as it says).
    A recipe that converts a file (`method: gguf`) runs where its source is the task's model: an empty `model:` (the
    default model's own GGUF, the one the default model's folder is prepared from) in a sweep whose model is the
    default, or the very path the task names as its model (a GGUF search's tries, gated against that source)."""
    recipe, sha = load_recipe(recipe_path)
    if recipe.method in FILE_METHODS:
        if recipe.model is None:  # compared before the default model is resolved: its refusal is not the reason
            same = model is None or expand_user(model, "model").resolve() == default_model_dir().resolve()
            if same:
                resolve_model(model)  # prepared (the default model's refusal says how)
        else:
            mine = expand_user(recipe.model, f"{recipe_path}: model")
            same = model is not None and mine.resolve() == expand_user(model, "model").resolve()
        if not same:
            raise UsageError(
                f"recipe {recipe_path} converts a GGUF (method {recipe.method.value}), and a sweep gates it against "
                "its baseline only where both are the default model (its own GGUF and the folder prepared from it): "
                f"this recipe's `model:` is {recipe.model or 'empty'}, the sweep's {model or 'the default model'}. "
                "Leave both empty, or gate a GGUF of another model alone: `quantize gate POLICY --baseline FOLDER "
                "--candidate GGUF`"
            )
        if output is not None:
            recipe.output = str(output)
        return recipe, sha
    if recipe.model is None and model is not None:
        recipe.model = model
    if resolve_model(recipe.model).resolve() != resolve_model(model).resolve():
        raise UsageError(
            f"recipe {recipe_path} converts {recipe.model or 'the default model'}, and the sweep's model (its "
            f"baseline) is {model or 'the default model'}: its verdict would be against another model. Remove the "
            "recipe's `model:` or set the sweep's `model:` to the same folder"
        )
    if output is not None:
        recipe.output = str(output)
    return recipe, sha


def source_weights(recipe: Any, model: str | None) -> str:
    """The weights hash a conversion of `recipe` records for its source (RunRecord.source_model.weights_sha256):
    a file-to-file recipe's source (a GGUF, or the folder llama.cpp's converter reads) hashed as the engine hashes
    it, any other recipe's model folder (the sweep's `model` where the recipe names none) as the loader records it."""
    if recipe.method in FILE_METHODS:
        return weights_sha256(source_gguf(recipe.model))
    return weights_sha256(resolve_model(recipe.model if recipe.model is not None else model))


def converted(out: Path, recipe_sha256: str, source_sha256: str) -> bool:
    """`out` is a whole output of this recipe file (the same bytes) converted from the source whose weights hash
    is `source_sha256` (source_weights): nothing to convert again. A recipe that names no model converts the
    sweep's, so the recipe's bytes alone did not say which model's conversion an output is: another model at the
    same path, or another sweep `model:`, reused it and gated it against the new baseline."""
    if not complete_output(out):
        return False
    meta = records.read(RunRecord, out / "quantize.json")
    return meta.recipe.sha256 == recipe_sha256 and meta.source_model.weights_sha256 == source_sha256


def convert_and_gate(convert: TaskSpec, gate: TaskSpec) -> Any:
    """A candidate converted, then gated, in this process (`quantize search`'s try); returns the Verdict, written
    as VERDICT_FILE and JUNIT_FILE (gate.json, gate.xml) beside it. The sweep runs the same two functions as two
    Ray tasks."""
    assert convert.kind == "convert" and gate.kind == "gate" and convert.checkpoint == gate.checkpoint
    run_convert(convert)
    return gate_candidate(gate)


def run_convert(task: TaskSpec) -> tuple[int, str, str | None]:

    assert task.recipe is not None and task.checkpoint is not None
    out = Path(task.checkpoint)
    recipe, sha = prepare_recipe(task.recipe, task.model, out)
    said = tidy_leftovers(out, task.clean)
    if converted(out, sha, source_weights(recipe, task.model)):  # an earlier attempt placed it, then its worker died
        return (
            EXIT_OK,
            "; ".join(["already converted (an earlier attempt finished it)", *said]),
            str(out / "quantize.json"),
        )
    meta = convert(recipe, sha, task.recipe, out, quiet=True)
    bpw = meta.bits.bits_per_weight
    done = (f"{bpw:.3f} bits per weight, " if bpw is not None else "") + f"{meta.bits.total_bytes:,} bytes"
    return EXIT_OK, "; ".join([done, *said]), str(out / "quantize.json")


def run_baseline(task: TaskSpec) -> tuple[int, str, str | None]:
    """The baseline's full scores (and its top-k where the policy has agreement rules) into the cache, where every
    gate task reads them: scored once for the whole sweep."""
    with quiet_libraries(True):
        cached = score_baseline(task.policy, Path(task.baseline))
    return EXIT_OK, "scores from the cache" if cached else "scored", None


def gate_candidate(task: TaskSpec) -> Any:
    """`quantize gate POLICY --baseline B --candidate C --junit C/gate.xml --json > C/gate.json`, each file whole;
    returns the Verdict."""
    assert task.checkpoint is not None
    cand = Path(task.checkpoint)
    with quiet_libraries(True):
        v = run_gate(task.policy, task.baseline, cand)
    save_verdict(v, cand / JUNIT_FILE, cand / VERDICT_FILE)
    return v


def run_gate_task(task: TaskSpec) -> tuple[int, str, str | None]:

    v = gate_candidate(task)
    return v.exit_code, headline(v), str(Path(str(task.checkpoint)) / VERDICT_FILE)


RUNNERS = {"convert": run_convert, "baseline": run_baseline, "gate": run_gate_task}
