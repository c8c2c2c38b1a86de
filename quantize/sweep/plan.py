"""The sweep's plan, made before Ray is imported: its candidates, what each still needs (a conversion, a gate),
and the candidates that cannot run (a bad recipe: exit 2, reported beside the others, not a stop). Candidates
that would share a folder or a report row (one name twice, one folder twice, a name of the sweep's own) stop the
sweep (`check_names`): exit 2 naming both.

A `matrix:` makes one candidate per cell: each base recipe's YAML with the cell's values set at their dotted
paths, named BASE-FIELD=VALUE-... (a field by its last part unless two fields share it; a path value by its
file's stem, a `builtin:` source by its name, a list or mapping by its place in the values, 1-based), validated
as a recipe (a bad cell is its candidate's exit 2). A field that is not in a base recipe's schema stops the sweep
(exit 2 naming it), as do two cells of one base whose recipes read alike (validated, every default filled in:
`symmetric: [true, 1]` or `[true, "yes"]` is one value listed twice). The cell's recipe is written to
OUTPUT/sweep-NAME/recipes/CELL.yaml when it is converted; its bytes are the same on every run, so a cell converted
before is recognised by them.

A candidate is done when its records are whole and valid for this sweep: a converted checkpoint whose
quantize.json reads and whose weights hash to what it records, from the same recipe bytes; a gate.json beside it
that is this policy's verdict on this baseline and this candidate (identities and golden set checked, as the
report checks it) and a gate's own decision, which the cache holds (a gate.json anyone else wrote there, a NaN
copy's forged pass among them, is gated again). A second run of the same sweep, after a killed driver, skips what
is done.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantize.checkpoint.files import identity_sha256
from quantize.config import MAX_YAML_BYTES, parse_yaml
from quantize.convert.backends import check
from quantize.convert.recipe import parse_recipe, resolved_dict
from quantize.errors import UsageError
from quantize.flows.gate import check_target
from quantize.gates.policy import Policy
from quantize.io import read_user_file, sha256_bytes, write_text_atomic
from quantize.names import checked, key, shown, unique
from quantize.records import VERDICT_FILE, Verdict
from quantize.report.collect import read_saved, saved_mismatch
from quantize.sweep.spec import SweepSpec
from quantize.sweep.tasks import TaskSpec, converted, prepare_recipe, source_weights


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
    source_weights: str = ""  # the weights hash its conversion records for its source (tasks.source_weights)
    cell: dict[str, Any] | None = None  # a matrix cell's values by field (None: not a cell)
    recipe_text: str | None = None  # a cell's recipe, written to `recipe` when it is converted


RESERVED = "sweep-"  # OUTPUT/sweep-NAME is a sweep's own folder: no candidate takes a name starting so


def candidates(spec: SweepSpec) -> list[Candidate]:
    """Recipes first (in the order given, globs sorted), then the existing checkpoints. A recipe that cannot be read is
    its candidate's error; two candidates of one name, one folder listed twice, or a name of the sweep's own
    (`sweep-*`) refuse the whole sweep (`check_names`), before any output is looked at."""
    found = [_of_recipe(spec, path) for path in spec.recipes]
    found += cells(spec)
    found += [_of_checkpoint(i, folder) for i, folder in enumerate(spec.checkpoints)]
    check_names(found)
    for c in found:
        if c.recipe is not None and c.error is None and c.checkpoint is not None:
            try:
                c.needs_convert = not _converted_here(c.checkpoint, c.recipe_sha256 or "", c.recipe, c.source_weights)
            except UsageError as e:
                c.error = str(e)
    return found


def _of_recipe(spec: SweepSpec, path: str) -> Candidate:
    try:
        recipe, sha = prepare_recipe(path, spec.model)  # its name checked as a path part (quantize/names.py)
    except UsageError as e:
        return Candidate(Path(path).stem, path, path, None, error=str(e))
    name = str(recipe.name)
    try:
        source = source_weights(recipe, spec.model)
    except UsageError as e:
        return Candidate(name, path, path, None, error=str(e))
    return Candidate(name, path, path, Path(spec.output) / name, recipe_sha256=sha, source_weights=source)


def _of_checkpoint(i: int, folder: str) -> Candidate:
    """A checkpoint gated where it is, named by its folder (`a/` and `./a` are `a`)."""
    name = Path(os.path.abspath(folder)).name
    c = Candidate(name, folder, None, Path(folder))
    try:
        c.name = checked(name, f"checkpoints[{i}] ({folder}): its folder's name", "rename the folder, or link to it")
        check_target(c.checkpoint, "a sweep gates checkpoint folders, not score files")
    except UsageError as e:
        c.error = str(e)
    return c


def _label(c: Candidate) -> str:
    if c.cell is not None:
        return f"matrix cell {c.source}"
    return f"recipe {c.source}" if c.recipe is not None else f"checkpoint {c.source}"


# --- matrix cells --------------------------------------------------------------------------------------------

OWN = {"name", "output", "model"}  # what a cell takes from the sweep: its name, its folder, the sweep's model


def cells(spec: SweepSpec) -> list[Candidate]:
    """Every base recipe × every combination of the matrix's values, in the order given (module docstring). Two cells
    of one base that are one recipe as a run reads it (the field's values differ only as written) are a UsageError
    naming the field and the values: the sweep would convert and gate that recipe twice."""
    if spec.matrix is None:
        return []

    out: list[Candidate] = []
    fields = list(spec.matrix.fields)
    short = _short_names(fields)
    for path in spec.matrix.recipes:
        try:
            base, _ = prepare_recipe(path, spec.model)
            raw = parse_yaml(read_user_file(path, "recipe file", MAX_YAML_BYTES), path)
        except UsageError as e:
            out.append(Candidate(Path(path).stem, path, path, None, error=str(e)))
            continue
        for f in fields:
            check_field(type(base), f, path)
        seen: dict[str, tuple[Candidate, dict[str, Any]]] = {}  # a recipe as a run reads it: its first cell
        for combo in itertools.product(*(enumerate(spec.matrix.fields[f], 1) for f in fields)):
            values = {f: v for f, (_, v) in zip(fields, combo, strict=True)}
            shown_as = [f"{short[f]}={_value_text(v, i)}" for f, (i, v) in zip(fields, combo, strict=True)]
            c, settings = _cell(spec, path, raw, values, "-".join([str(base.name), *shown_as]))
            if settings is not None:
                key = json.dumps(settings, sort_keys=True)
                if (first := seen.setdefault(key, (c, settings)))[0] is not c:
                    raise UsageError(_same_recipe(path, first[0], c, first[1]))
            out.append(c)
    return out


def _same_recipe(base: str, first: Candidate, again: Candidate, settings: dict[str, Any]) -> str:
    """Two cells of one base whose recipes read alike (`symmetric: [true, 1]`, `[true, "yes", "on"]`: one boolean
    as the recipe model reads each): the fields whose values differ, as written and as read."""
    assert first.cell is not None and again.cell is not None
    differ = [f for f in first.cell if _written(first.cell[f]) != _written(again.cell[f])] or list(first.cell)

    def read(path: str) -> Any:
        v: Any = settings
        for part in path.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        return v

    said = "; ".join(
        f"{f} {_written(first.cell[f])} and {_written(again.cell[f])} are both {_written(read(f))}" for f in differ
    )
    return (
        f"matrix.fields: {' and '.join(differ)} list{'s' if len(differ) == 1 else ''} one value twice as recipe "
        f"{base} reads {'it' if len(differ) == 1 else 'them'} ({said}): cells {shown(first.name)} and "
        f"{shown(again.name)} are one recipe, which the sweep would convert and gate twice. List each value once"
    )


def _written(v: Any) -> str:
    """A value as YAML's flow style writes it (`true`, `32.0`, `"yes"`)."""
    return json.dumps(v, ensure_ascii=False, default=str)


def _cell(
    spec: SweepSpec, base: str, raw: Any, values: dict[str, Any], name: str
) -> tuple[Candidate, dict[str, Any] | None]:
    """The cell's candidate, and its recipe as a run reads it less its name (resolved_dict: every default filled in,
    every value as the recipe model took it), to find two cells that are one recipe; None where it is refused."""
    import copy

    import yaml

    said = ", ".join(f"{f}={v!r}" for f, v in values.items())
    source = f"{base} with {said}"
    data = copy.deepcopy(raw) if isinstance(raw, dict) else {}
    for f, v in values.items():
        _set(data, f, v)
    data.pop("output", None)
    try:
        data["name"] = checked(name, f"matrix cell {source}: its name", "give the base recipe a shorter `name:`")
        recipe = parse_recipe(data, f"matrix cell {source}")
        check(recipe)  # what its backend runs, as the conversion's preflight checks it
        weights = source_weights(recipe, spec.model)
    except UsageError as e:
        return Candidate(name, source, None, None, error=str(e), cell=values), None
    recipe_file = spec.home / "recipes" / f"{data['name']}.yaml"
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    c = Candidate(
        str(recipe.name), source, str(recipe_file), Path(spec.output) / str(recipe.name), cell=values, recipe_text=text
    )
    c.recipe_sha256, c.source_weights = sha256_bytes(text.encode("utf-8")), weights
    settings = resolved_dict(recipe)
    settings.pop("name", None)
    return c, settings


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        if not isinstance(data.get(p), dict):
            data[p] = {}
        data = data[p]
    data[leaf] = value


def _short_names(fields: list[str]) -> dict[str, str]:
    """A field's last part in a cell's name, or its whole path where two fields share the last part."""
    leaves = [f.rsplit(".", 1)[-1] for f in fields]
    return {f: leaf if leaves.count(leaf) == 1 else f for f, leaf in zip(fields, leaves, strict=True)}


def _value_text(v: Any, place: int) -> str:
    """A value as a name part: numbers and words as written, a path by its file's stem (`builtin:jargon` as
    `jargon`), None as none, a list or a mapping (a mixture) by its place among the field's values."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, str):
        part = re.split(r"[/\\:]", v.rstrip("/\\"))[-1] or v
        return Path(part).stem if "." in part[1:] else part
    return str(place)


def check_field(model: type, path: str, recipe: str) -> None:
    """`path` names a field of `model` (a recipe class), through nested models; a UsageError naming it if not."""
    from pydantic import BaseModel

    cls: Any = model
    parts = path.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "a recipe"
        fields = getattr(cls, "model_fields", {})
        if i == 0 and part in OWN:
            raise UsageError(
                f"matrix.fields: {path} is the sweep's to set (a cell's name and folder come from its values, its "
                "model is the sweep's `model:`): vary another field"
            )
        if part not in fields:
            raise UsageError(
                f"matrix.fields: {path} is not a field of recipe {recipe} ({getattr(model, '__name__', model)}): "
                f"{where} has {', '.join(sorted(set(fields) - OWN))}. Correct the field's path"
            )
        if i < len(parts) - 1:
            inner = [a for a in _members(fields[part].annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
            if not inner:
                raise UsageError(
                    f"matrix.fields: {path}: {'.'.join(parts[: i + 1])} of recipe {recipe} is a value, not a section"
                    " with fields: vary it as a whole"
                )
            cls = inner[0]


def _members(annotation: Any) -> list[Any]:
    """An annotation's types, unions (`X | None`) and Annotated unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


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


def _converted_here(out: Path, sha: str, recipe: str, source: str) -> bool:
    """Whether `out` already holds this recipe's conversion of the sweep's model (every recipe of a sweep converts
    it: prepare_recipe; `source`: its weights hash, tasks.source_weights); another recipe's or another model's
    output there is refused."""
    if not out.exists():
        return False
    if not converted(out, sha, source):
        raise UsageError(
            f"{out} exists and is not a whole conversion of {recipe} as it is now from the sweep's model as it is now "
            "(another recipe, an earlier version of it, another model's weights, or an incomplete folder): the sweep "
            "will not replace it. Remove it, or set the sweep's `output:` to another folder"
        )
    return True


def write_cells(cands: list[Candidate]) -> None:
    """The recipe of each matrix cell still to convert, written whole where its convert task reads it."""
    for c in cands:
        if c.recipe_text is not None and c.needs_convert and c.error is None and c.recipe is not None:
            Path(c.recipe).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(Path(c.recipe), c.recipe_text)


def settle_done(cands: list[Candidate], policy: Policy, suite, baseline: Path) -> None:
    """Mark the candidates whose verdict is already written and valid (module docstring); a gate.json that is not
    is a note on its candidate (why), which is gated again and its file replaced."""
    base_id = identity_sha256(baseline)
    for c in cands:
        if c.error is not None or c.needs_convert or c.checkpoint is None:
            continue
        try:
            saved = read_saved(c.checkpoint)
        except UsageError as e:  # a verdict that does not read is not done: gated again, and replaced
            c.notes.append(f"its {VERDICT_FILE} was not read ({str(e)[:200]}); gating again")
            continue
        if saved is None:
            continue
        if (why := saved_mismatch(saved, policy, suite, base_id, identity_sha256(c.checkpoint))) is None:
            c.verdict = saved
        else:
            c.notes.append(f"its {VERDICT_FILE} is not this sweep's verdict ({why[:300]}); gating again")


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
