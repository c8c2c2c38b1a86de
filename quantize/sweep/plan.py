"""The sweep's plan, made before Ray is imported: its candidates, what each still needs (a conversion, a gate),
and the candidates that cannot run (a bad recipe: exit 2, reported beside the others, not a stop). Candidates
that would share a folder or a report row (one name twice, one folder twice, a name of the sweep's own) stop the
sweep (`check_names`): exit 2 naming both.

A candidate is done when its records are whole and valid for this sweep: a converted checkpoint whose
quantize.json reads and whose weights hash to what it records, from the same recipe bytes; a gate.json beside it
that is this policy's verdict on this baseline and this candidate (identities and golden set checked, as the
report checks it). A second run of the same sweep, after a killed driver, skips what is done.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from quantize.errors import UsageError
from quantize.gates.policy import Policy
from quantize.names import checked, key, shown, unique
from quantize.records import Verdict
from quantize.sweep.spec import SweepSpec
from quantize.sweep.tasks import TaskSpec, converted, prepare_recipe


@dataclass
class Candidate:
    name: str
    source: str  # the recipe file or the checkpoint folder given
    recipe: str | None  # None: an existing checkpoint
    checkpoint: Path | None  # the folder gated (None: its recipe could not be read)
    error: str | None = None  # why it cannot run (exit 2), found before anything ran
    needs_convert: bool = False
    verdict: Verdict | None = None  # from an earlier run, still valid: nothing to do
    notes: list[str] = field(default_factory=list)
    recipe_sha256: str | None = None  # the recipe file's bytes, once read


RESERVED = "sweep-"  # OUTPUT/sweep-NAME is a sweep's own folder: no candidate takes a name starting so


def candidates(spec: SweepSpec) -> list[Candidate]:
    """Recipes first (in the order given, globs sorted), then the existing checkpoints. A recipe that cannot be read is
    its candidate's error; two candidates of one name, one folder listed twice, or a name of the sweep's own
    (`sweep-*`) refuse the whole sweep (`check_names`), before any output is looked at."""
    found = [_of_recipe(spec, path) for path in spec.recipes]
    found += [_of_checkpoint(i, folder) for i, folder in enumerate(spec.checkpoints)]
    check_names(found)
    for c in found:
        if c.recipe is not None and c.error is None and c.checkpoint is not None:
            try:
                c.needs_convert = not _converted_here(c.checkpoint, c.recipe_sha256 or "", c.recipe)
            except UsageError as e:
                c.error = str(e)
    return found


def _of_recipe(spec: SweepSpec, path: str) -> Candidate:
    try:
        recipe, sha = prepare_recipe(path, spec.model)  # its name checked as a path part (quantize/names.py)
    except UsageError as e:
        return Candidate(Path(path).stem, path, path, None, error=str(e))
    name = str(recipe.name)
    return Candidate(name, path, path, Path(spec.output) / name, recipe_sha256=sha)


def _of_checkpoint(i: int, folder: str) -> Candidate:
    """A checkpoint gated where it is, named by its folder (`a/` and `./a` are `a`)."""
    name = Path(os.path.abspath(folder)).name
    c = Candidate(name, folder, None, Path(folder))
    try:
        c.name = checked(name, f"checkpoints[{i}] ({folder}): its folder's name", "rename the folder, or link to it")
        from quantize.flows.gate import check_target

        check_target(c.checkpoint, "a sweep gates checkpoint folders, not score files")
    except UsageError as e:
        c.error = str(e)
    return c


def _label(c: Candidate) -> str:
    return f"recipe {c.source}" if c.recipe is not None else f"checkpoint {c.source}"


def check_names(cands: list[Candidate]) -> None:
    """The candidates that can run are one folder and one report row each: no name twice (NFC, case-folded), no
    folder twice (links followed), no name a sweep's own folder takes (OUTPUT/sweep-NAME). UsageError naming both."""
    ok = [c for c in cands if c.error is None]
    for c in ok:
        if key(c.name).startswith(RESERVED):
            raise UsageError(
                f"{_label(c)} is named {shown(c.name)}: OUTPUT/{RESERVED}* holds sweeps' own folders (sweep.json, "
                f"report/, state/). Give it another name (a recipe's `name:`, a checkpoint's folder)"
            )
    _one_folder_each([c for c in ok if c.recipe is None])  # a checkpoint listed twice ("a", "a/", "./a", a link)
    unique(
        [(c.name, _label(c)) for c in ok],
        "candidates of this sweep",
        "give one recipe another `name:`, or list one of them only",
    )
    _one_folder_each(ok)  # a recipe's output that a listed checkpoint reaches through a link


def _one_folder_each(cands: list[Candidate]) -> None:
    folders: dict[str, Candidate] = {}
    for c in cands:
        assert c.checkpoint is not None  # a candidate that can run has its folder
        real = os.path.realpath(c.checkpoint)  # a candidate that can run names no NUL (names.py, check_target)
        if (first := folders.setdefault(real, c)) is not c:
            raise UsageError(
                f"{_label(first)} and {_label(c)} are one folder ({real}): it would be gated twice and its verdict "
                "written twice. List it once"
            )


def _converted_here(out: Path, sha: str, recipe: str) -> bool:
    """Whether `out` already holds this recipe's conversion; another recipe's output there is refused."""
    if not out.exists():
        return False
    if not converted(out, sha):
        raise UsageError(
            f"{out} exists and is not a whole conversion of {recipe} as it is now (another recipe, an earlier version "
            "of it, or an incomplete folder): the sweep will not replace it. Remove it, or set the sweep's `output:` "
            "to another folder"
        )
    return True


def settle_done(cands: list[Candidate], policy: Policy, suite, baseline: Path) -> None:
    """Mark the candidates whose verdict is already written and valid (module docstring)."""
    from quantize.checkpoint.files import identity_sha256
    from quantize.report.collect import saved_verdict

    base_id = identity_sha256(baseline)
    for c in cands:
        if c.error is not None or c.needs_convert or c.checkpoint is None:
            continue
        try:
            c.verdict = saved_verdict(c.checkpoint, policy, suite, base_id, identity_sha256(c.checkpoint))
        except UsageError as e:  # a verdict that does not read is not done: gated again, and replaced
            c.notes.append(f"its gate.json was not read ({str(e)[:200]}); gating again")


def tasks_of(spec: SweepSpec, c: Candidate, baseline: str, clean: bool) -> tuple[TaskSpec | None, TaskSpec | None]:
    """The candidate's convert and gate tasks (None where done or impossible)."""
    if c.error is not None or c.verdict is not None or c.checkpoint is None:
        return None, None
    convert = None
    if c.needs_convert:
        convert = TaskSpec(
            kind="convert",
            candidate=c.name,
            policy=spec.policy,
            baseline=baseline,
            model=spec.model,
            recipe=c.recipe,
            checkpoint=str(c.checkpoint),
            clean=clean,
        )
    gate = TaskSpec(kind="gate", candidate=c.name, policy=spec.policy, baseline=baseline, checkpoint=str(c.checkpoint))
    return convert, gate
