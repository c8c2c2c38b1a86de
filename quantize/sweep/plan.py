"""The sweep's plan, made before Ray is imported: its candidates, what each still needs (a conversion, a gate),
and the candidates that cannot run (a bad recipe: exit 2, reported beside the others, not a stop).

A candidate is done when its records are whole and valid for this sweep: a converted checkpoint whose
quantize.json reads and whose weights hash to what it records, from the same recipe bytes; a gate.json beside it
that is this policy's verdict on this baseline and this candidate (identities and golden set checked, as the
report checks it). A second run of the same sweep, after a killed driver, skips what is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantize.errors import UsageError
from quantize.gates.policy import Policy
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


def candidates(spec: SweepSpec) -> list[Candidate]:
    """Recipes first (in the order given, globs sorted), then the existing checkpoints; a name used twice is an
    error on the second (two outputs in one folder, or two verdicts in one report row)."""
    found: list[Candidate] = []
    for path in spec.recipes:
        try:
            recipe, sha = prepare_recipe(path, spec.model)
            out = Path(spec.output) / str(recipe.name)
            c = Candidate(str(recipe.name), path, path, out, needs_convert=not _converted_here(out, sha, path))
        except UsageError as e:
            c = Candidate(Path(path).stem, path, path, None, error=str(e))
        found.append(c)
    for folder in spec.checkpoints:
        p = Path(folder)
        c = Candidate(p.name, folder, None, p)
        try:
            from quantize.flows.gate import check_target

            check_target(p, "a sweep gates checkpoint folders, not score files")
        except UsageError as e:
            c.error = str(e)
        found.append(c)
    seen: dict[str, Candidate] = {}
    for c in found:
        if c.error is None and c.name in seen:
            c.error = (
                f"two candidates are named {c.name} ({seen[c.name].source} and {c.source}): their checkpoints or "
                "verdicts would share a folder. Give one recipe another `name:`, or drop one of them"
            )
        seen.setdefault(c.name, c)
    return found


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
