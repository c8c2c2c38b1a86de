"""Verify a golden-set version against its MANIFEST, and hand its tasks to lm-eval.

A version folder is immutable: every file is listed in MANIFEST.json with its sha256 and item
count, and any difference (a changed byte, a missing or unlisted file, a file that leads outside the
folder) is an error naming the file. A MANIFEST can be rewritten by whoever edits the files, so the
items are checked too (quantize/golden/items.py), line by line as each file is hashed. Scoring calls
`verify` first and refuses an unverified set.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantize import names
from quantize.cache import content_path
from quantize.config import MAX_YAML_BYTES, Wording, parse_yaml, validate
from quantize.errors import UsageError
from quantize.golden import items
from quantize.golden.items import MAX_ITEM_BYTES, MAX_SET_FILE_BYTES
from quantize.io import atomic_file, read_user_file, sha256_bytes, sha256_file, user_lines
from quantize.kinds import KINDS, OUTPUT_TYPES, metric_name

MANIFEST_FILE = "MANIFEST.json"  # what makes a folder a golden-set version
MAX_MANIFEST_BYTES = 16 * 2**20  # a MANIFEST: hashes, smoke ids and few-shot ids, kilobytes to a megabyte
HINT = "restore the version folder from version control"

# lm-eval's aggregation of a metric a task lists without one (the rest average per item)
DEFAULT_AGGREGATION = {
    "perplexity": "perplexity",
    "word_perplexity": "weighted_perplexity",
    "byte_perplexity": "weighted_perplexity",
    "bits_per_byte": "bits_per_byte",
}


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    items: int | None = Field(None, ge=0, description="lines of a .jsonl file; null for other files")


OutputType = Literal[OUTPUT_TYPES]  # the registry's kinds (quantize/kinds.py)


def _inside_folder(name: str) -> str:
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or not parts or parts[0] not in ("data", "tasks"):
        raise ValueError(f"file {name!r} is not inside the version folder's data/ or tasks/")
    return name


class TaskEntry(BaseModel):
    """One task of a golden set written by `golden new` or `golden freeze`: where its items are, what
    kind they are, and which item fields hold the stable id and the cluster."""

    model_config = ConfigDict(extra="forbid")

    data: str = Field(description="the items, e.g. data/faq.jsonl")
    fewshot: str | None = Field(None, description="the frozen few-shot examples, when the task uses any")
    fewshot_ids: list[str] = Field(default_factory=list)
    output_type: OutputType
    id_field: str = "id"
    cluster_field: str | None = Field(None, description="null: every item is its own cluster")
    source: dict[str, Any] = Field(default_factory=dict)

    @field_validator("data", "fewshot")
    @classmethod
    def _inside(cls, v: str | None) -> str | None:
        return v if v is None else _inside_folder(v)


class Manifest(BaseModel):
    """MANIFEST.json of a golden-set version: what `verify` checks every file against."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    group: str
    task_version: Annotated[float, Field(allow_inf_nan=False)] | str  # NaN verified and was stored as "NaN"
    files: dict[str, FileEntry] = Field(min_length=1)
    smoke_ids: dict[str, list[str]] = Field(default_factory=dict)
    tasks: dict[str, TaskEntry] | None = Field(None, description="absent in core/v1: tasks follow its file names")
    seed: int | None = None
    sources: dict[str, Any] = Field(default_factory=dict)
    builder: dict[str, Any] = Field(default_factory=dict)
    note: str | None = None

    @field_validator("files")
    @classmethod
    def _inside(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in files:
            _inside_folder(name)
        return files

    @model_validator(mode="after")
    def _listed(self) -> Manifest:
        for task, entry in (self.tasks or {}).items():
            for f in (entry.data, entry.fewshot):
                if f is not None and f not in self.files:
                    raise ValueError(f"task {task}: {f} is not listed in files")
        return self


@dataclass(frozen=True)
class GoldenSet:
    path: Path
    manifest: Manifest
    manifest_sha256: str
    entries: dict[str, TaskEntry]  # task -> where its items are and how they are keyed (task_entries)

    @property
    def tasks(self) -> list[str]:
        return sorted(self.entries)

    def entry(self, task: str) -> TaskEntry:
        return self.entries[task]

    def item_key(self, task: str) -> tuple[str, str | None]:
        """(id field, cluster field or None) of a task's items."""
        e = self.entry(task)
        return e.id_field, e.cluster_field

    def item_metrics(self, task: str) -> list[str]:
        """The per-item metrics lm-eval computes on a task besides its kind's own (quantize/kinds.py): each entry
        of the task YAML's `metric_list` averaged per item (aggregation mean), under each filter pipeline, named
        as `kinds.metric_name` names them (acc_norm, exact_match@strict-match)."""
        cfg = task_config(self.path, f"tasks/{task}.yaml") or {}
        filters = [f.get("name", "none") for f in cfg.get("filter_list") or []] or ["none"]
        own = KINDS[self.entry(task).output_type].metrics
        out = []
        for m in cfg.get("metric_list") or []:
            name = m.get("metric")
            if not isinstance(name, str) or (m.get("aggregation") or DEFAULT_AGGREGATION.get(name, "mean")) != "mean":
                continue
            out += [metric_name(name, f) for f in filters if not (f == "none" and name in own)]
        return out

    def provenance(self) -> dict[str, Any]:
        return {
            "name": self.manifest.name,
            "version": self.manifest.version,
            "path": str(self.path),
            "manifest_sha256": self.manifest_sha256,
            "task_version": self.manifest.task_version,
        }


def verify(path: str | Path) -> GoldenSet:
    """Check a version folder against its MANIFEST (module docstring) and its items (quantize/golden/items.py), every
    file read the one safe way and hashed as it streams; all problems at once, exit 2."""
    root = Path(path)
    mpath = root / "MANIFEST.json"
    if not (mpath.exists() or mpath.is_symlink()):
        raise UsageError(f"{root} is not a golden-set version: it has no MANIFEST.json (expected e.g. golden/core/v1)")
    hint = "restore it from version control"
    if outside := _leaves(root, "MANIFEST.json"):
        raise UsageError(f"golden set {root} failed verification: {outside}")
    raw = read_user_file(mpath, "golden-set manifest", MAX_MANIFEST_BYTES, hint=hint)
    try:
        data = json.loads(raw.decode("utf-8"))  # strictly: json.loads(bytes) also takes UTF-16 and UTF-32
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UsageError(f"{mpath} is not a valid manifest: not JSON ({str(e)[:200]}); {hint}") from None
    manifest = validate(Manifest, data, str(mpath), "golden-set manifest", Wording(regenerate=hint))
    files = manifest.files
    configs: dict[str, Any] = {}
    tasks = sorted((n, e) for n, e in files.items() if n.startswith("tasks/"))
    problems = [p for name, e in tasks for p in _check_task_file(root, name, e, configs)]
    entries = task_entries(root, manifest, configs)
    problems += smoke_problems(manifest, entries)
    problems += _check_data_files(root, manifest, entries, configs)
    problems += _outside_reads(root, manifest, configs)
    problems += _entries_are_what_lm_eval_reads(root, entries, configs)
    listed = set(files)
    for sub in ("data", "tasks"):
        for p in sorted((root / sub).glob("*")) if (root / sub).is_dir() else []:
            if f"{sub}/{p.name}" not in listed:
                problems.append(f"{sub}/{p.name}: not listed in the manifest")
    if problems:
        raise UsageError(
            f"golden set {root} failed verification:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nA version is immutable: restore the files from version control, or build a new version folder."
        )
    return GoldenSet(root, manifest, sha256_bytes(raw), entries)


def _leaves(root: Path, name: str) -> str | None:
    """A problem when `name` (or a link on its way) leads outside the version folder, else None."""
    try:
        where = (root / name).resolve()
        inside = where.is_relative_to(root.resolve())
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte
        return f"{name}: a link that cannot be followed (a loop); a set holds its own files"
    if inside:
        return None
    return f"{name}: a link that leads outside the version folder (to {where}); a set holds its own files"


def _listed_problem(root: Path, name: str) -> str | None:
    p = root / name
    if not (p.exists() or p.is_symlink()):
        return f"{name}: listed in the manifest but missing"
    return _leaves(root, name)


def _digest_problems(name: str, entry: FileEntry, digest: str, newlines: int) -> list[str]:
    if digest != entry.sha256:
        return [f"{name}: sha256 differs from the manifest (the file was changed)"]
    if entry.items is not None and newlines != entry.items:
        return [f"{name}: {newlines} items, the manifest says {entry.items}"]
    return []


def _check_task_file(root: Path, name: str, entry: FileEntry, configs: dict[str, Any]) -> list[str]:
    """A task YAML: hashed, and parsed with the project's YAML limits into `configs` (for the checks after)."""
    if problem := _listed_problem(root, name):
        return [problem]
    try:
        raw = read_user_file(root / name, "golden task file", MAX_YAML_BYTES)
    except UsageError as e:
        return [f"{name}: {e}"]
    problems = _digest_problems(name, entry, sha256_bytes(raw), raw.count(b"\n"))
    try:
        configs[name] = parse_yaml(raw, name)
    except UsageError as e:
        problems.append(f"{name}: not plain YAML a golden set can check ({str(e)[:120]})")
    return problems


def smoke_problems(manifest: Manifest, entries: dict[str, TaskEntry]) -> list[str]:
    """The smoke subset names tasks of the set, each with one item at least: `smoke_ids: {core_cloze: []}` verified,
    then a smoke run scored no item of it and lm-eval stopped with exit 3, and a task the set does not have was
    accepted and never read (a review)."""
    unknown = [t for t in manifest.smoke_ids if t not in entries]
    empty = [t for t, ids in manifest.smoke_ids.items() if t in entries and not ids]
    return [f"MANIFEST.json: smoke_ids names task {t}, which the set does not have" for t in unknown] + [
        f"MANIFEST.json: smoke_ids of {t} is empty; list one item at least, or leave the task out of smoke_ids"
        for t in empty
    ]


def _check_data_files(
    root: Path, manifest: Manifest, entries: dict[str, TaskEntry], configs: dict[str, Any]
) -> list[str]:
    """Every data/ file hashed as it streams; a task's items and few-shot examples checked on the way
    (quantize/golden/items.py), and the smoke ids against the items found."""
    roles: dict[str, list[tuple[str, str]]] = {}  # a file two tasks read is checked for each (a review: one kept)
    problems = []
    for task, e in sorted(entries.items()):
        roles.setdefault(e.data, []).append(("items", task))
        if e.fewshot is not None:
            roles.setdefault(e.fewshot, []).append(("fewshot", task))
        elif e.fewshot_ids:
            problems.append(f"MANIFEST.json: task {task} lists fewshot_ids but no fewshot file")
    by_task = {c.get("task"): c for c in configs.values() if isinstance(c, dict) and isinstance(c.get("task"), str)}
    for name, entry in sorted(manifest.files.items()):
        if name.startswith("tasks/"):
            continue
        if problem := _listed_problem(root, name):
            problems.append(problem)
            continue
        readers = roles.get(name) or [("", "")]
        for n, (role, task) in enumerate(readers):
            try:
                with user_lines(
                    root / name, "golden data file", MAX_SET_FILE_BYTES, MAX_ITEM_BYTES, hint=HINT
                ) as lines:
                    found = _read_as(lines, name, role, task, manifest, entries, by_task.get(task) or {}, problems)
                    if n == 0:  # the bytes are the same whichever task reads them
                        problems += _digest_problems(name, entry, lines.hexdigest(), lines.newlines)
                    said = found.lines() if found else []
                    problems += [f"{p} (read as {task}'s {role})" for p in said] if len(readers) > 1 else said
            except UsageError as e:
                problems.append(f"{name}: {e}")
    return problems


def _read_as(  # noqa: PLR0913 (the file, what it is to a task, and the manifest's and the task's rules for it)
    lines: Any,
    name: str,
    role: str,
    task: str,
    manifest: Manifest,
    entries: dict[str, TaskEntry],
    cfg: dict[str, Any],
    problems: list[str],
) -> Any:
    """A data file checked as one task reads it (`role`: its items or its few-shot examples; "": no task reads it,
    only hashed); what the check found, or None."""
    if role == "items":
        found = items.check_items(lines, name, _rules(task, entries[task], cfg, problems))
        if not found.ids and not found.lines():  # lm-eval stops on an empty split (StopIteration)
            problems.append(f"{name}: task {task} holds no items; every task of a golden set needs items")
        if missing := [i for i in manifest.smoke_ids.get(task, []) if items.id_key(i) not in found.ids]:
            problems.append(f"MANIFEST.json: smoke_ids of {task} name {missing[0]!r}, no item of {name}")
        return found
    if role == "fewshot":
        return items.check_fewshot(lines, name, entries[task].fewshot_ids)
    lines.drain()
    return None


def _rules(task: str, entry: TaskEntry, cfg: dict[str, Any], problems: list[str]) -> items.TaskRules:
    """What the task's items must hold (quantize/golden/items.py); a template the check cannot render is named."""
    rules = items.TaskRules(
        task, entry.id_field, entry.cluster_field, frozenset(entry.fewshot_ids) if entry.fewshot else None
    )
    if entry.output_type == "multiple_choice":
        rules.target, rules.choice = cfg.get("doc_to_target"), cfg.get("doc_to_choice")
        if problem := items.compile_templates(rules):
            problems.append(f"task {task}: {problem}")
            rules.target = rules.choice = None
    return rules


def _outside_reads(root: Path, manifest: Manifest, configs: dict[str, Any]) -> list[str]:
    """What the task YAMLs would read beyond the version folder: every task reads local JSON (`dataset_path:
    json`) from `data_files` that resolve inside the folder and are listed in the manifest; no `include:`. A set
    that verifies therefore holds all its data, and editing a file it reads changes a hash it is checked by."""
    problems = []
    for name in sorted(n for n in manifest.files if n in configs):  # a YAML that did not parse is already named
        cfg = configs[name]
        if isinstance(cfg, dict) and "group" in cfg:
            members = cfg.get("task") if isinstance(cfg.get("task"), list) else [cfg.get("task")]
            if not all(isinstance(m, str) for m in members):
                problems.append(f"{name}: a group that defines tasks inline; a group names the set's task files")
            continue  # a group file names tasks, it reads no data
        if not isinstance(cfg, dict) or "task" not in cfg:
            continue
        if "include" in cfg:
            problems.append(f"{name}: `include: {cfg['include']}` pulls in a file the manifest does not check")
        problems += _named_parts(name, cfg)
        if cfg.get("dataset_path") != "json":
            problems.append(f"{name}: dataset_path {cfg.get('dataset_path')!r}; a golden task reads its own JSON")
        files = data_files(cfg)
        if not isinstance(files, dict) or not files:
            problems.append(f"{name}: no dataset_kwargs.data_files naming the set's own data/ files")
            continue
        for split, rel in files.items():
            for r in rel if isinstance(rel, list) else [rel]:
                try:
                    where = (root / "tasks" / str(r)).resolve()
                except (ValueError, OSError):  # a NUL byte, a path too long: no file a set can hold
                    problems.append(f"{name}: split {split} reads {str(r)[:80]!r}, which names no file")
                    continue
                inside = where.is_relative_to(root.resolve())
                listed = inside and where.relative_to(root.resolve()).as_posix() in manifest.files
                if not listed:
                    problems.append(
                        f"{name}: split {split} reads {r}, which is "
                        + ("outside the version folder" if not inside else "not listed in the manifest")
                    )
    return problems


def _entries_are_what_lm_eval_reads(root: Path, entries: dict[str, TaskEntry], configs: dict[str, Any]) -> list[str]:
    """Each task entry (whose file verify checks item by item) is what lm-eval scores: a task YAML of that name and
    output type whose scored split (`test_split`, else `validation_split`) reads the entry's data file, and whose
    other splits read its few-shot file or that data file alone. A YAML reading another listed file (only hashed,
    its items unchecked: duplicate ids collapsed a gate's pairs to 7 of 12) verified; a task with no YAML, or of
    another output type, failed only at scoring (exit 3 after the load)."""
    by_task = {c["task"]: (n, c) for n, c in configs.items() if isinstance(c, dict) and isinstance(c.get("task"), str)}
    problems = []
    for task, e in sorted(entries.items()):
        if task not in by_task:
            problems.append(f"MANIFEST.json: task {task} has no task YAML of that name (`task: {task}`)")
            continue
        name, cfg = by_task[task]
        if cfg.get("output_type") != e.output_type:
            problems.append(f"{name}: output_type {cfg.get('output_type')!r}, the manifest says {e.output_type!r}")
        files = data_files(cfg)
        if not isinstance(files, dict):
            continue  # _outside_reads names it
        scored = scored_split(cfg)
        allowed = {e.data, *([e.fewshot] if e.fewshot else [])}
        for split, rel in files.items():
            if not isinstance(rel, str):
                problems.append(f"{name}: split {split} reads {str(rel)[:80]}; a split reads one file of the set")
                continue
            where = _relative(root, rel)
            if split == scored and where != e.data:
                problems.append(
                    f"{name}: its scored split {split} reads {rel}, the manifest's items of {task} are {e.data}"
                )
            elif where not in allowed:
                problems.append(
                    f"{name}: split {split} reads {rel}, which is neither {task}'s items nor its few-shot file"
                )
        if scored not in files:
            problems.append(f"{name}: it scores split {scored!r}, which its data_files do not name")
    return problems


def scored_split(cfg: dict[str, Any]) -> str | None:
    """The split lm-eval scores of a task: its `test_split`, else its `validation_split`."""
    return cfg.get("test_split") or cfg.get("validation_split")


def data_files(cfg: Any) -> Any:
    """A task YAML's dataset_kwargs.data_files as written, or None where dataset_kwargs is not a mapping (a
    `dataset_kwargs: [1]` was an AttributeError, exit 3)."""
    kwargs = cfg.get("dataset_kwargs") if isinstance(cfg, dict) else None
    return kwargs.get("data_files") if isinstance(kwargs, dict) else None


def _relative(root: Path, rel: str) -> str | None:
    """A task YAML's data path (relative to tasks/) as a manifest name, or None where it leaves the folder."""
    try:
        where = (root / "tasks" / rel).resolve()
    except (ValueError, OSError):
        return None
    base = root.resolve()
    return where.relative_to(base).as_posix() if where.is_relative_to(base) else None


def _named_parts(name: str, cfg: dict[str, Any]) -> list[str]:
    """A task's name and its data_files split keys are names (quantize/names.py): `golden export` names files
    TASK.SPLIT.jsonl by them, and `task: /tmp/x` wrote wherever it said."""
    files = data_files(cfg)
    parts = [("task", cfg["task"]), *(("split", k) for k in (files if isinstance(files, dict) else {}))]
    return [
        f"{name}: {what} {names.shown(part)} {why}; {names.RULE}"
        for what, part in parts
        if (why := names.problem(part)) is not None
    ]


def task_entries(root: Path, manifest: Manifest, configs: dict[str, Any] | None = None) -> dict[str, TaskEntry]:
    """Each task's entry, read once. core/v1 predates task entries: its tasks are tasks/*.yaml but the
    group's, its items data/<task without the group prefix>.jsonl with `id` and `cluster` fields.
    `configs`: the task YAMLs already parsed (by verify), by file name."""
    if manifest.tasks:
        return dict(manifest.tasks)
    group, out = manifest.group, {}
    for n in manifest.files:
        task = Path(n).stem
        if n.startswith("tasks/") and task != group:
            try:
                kind = (configs[n] if configs is not None and n in configs else task_config(root, n))["output_type"]
                out[task] = TaskEntry(
                    data=f"data/{task.removeprefix(f'{group}_')}.jsonl", output_type=kind, cluster_field="cluster"
                )
            except (UsageError, TypeError, KeyError, ValueError) as e:
                raise UsageError(
                    f"{root / n} is not an lm-eval task YAML with a supported output_type ({str(e)[:120]}); "
                    "restore it from version control"
                ) from None
    return out


def task_config(root: Path, name: str) -> Any:
    """A task YAML of a version folder, read the one safe way and parsed with the project's YAML limits."""
    return parse_yaml(read_user_file(root / name, "golden task file", MAX_YAML_BYTES, hint=HINT), str(root / name))


def read_items(golden: GoldenSet, task: str, limit: int | None = None) -> list[dict[str, Any]]:
    """A task's items (its first `limit` only, where given), read line by line (a verified set's lines are JSON
    objects)."""
    path = golden.path / golden.entry(task).data
    with user_lines(path, "golden data file", MAX_SET_FILE_BYTES, MAX_ITEM_BYTES, hint=HINT) as lines:
        return [json.loads(lines.text(n, raw)) for n, raw in itertools.islice(lines, limit)]


def item_id(doc: dict[str, Any], key: tuple[str, str | None]) -> tuple[str, str]:
    """(id, cluster) of an item; an item without a cluster field is its own cluster."""
    i = str(doc[key[0]])
    return i, (str(doc[key[1]]) if key[1] else i)


def addressed(golden: GoldenSet, src: Path) -> Path:
    """The path lm-eval reads the set's data file `src` from: a copy named by its sha256 in the manifest
    ($QUANTIZE_CACHE/golden-data/SHA.jsonl), written where missing or not those bytes, from `src` checked against
    that sha256. lm-eval loads it through HF datasets, whose cache knows a local file by its path and mtime alone:
    a data file rewritten in place with its mtime kept was served as its old items (a review's repro: a target
    changed, the manifest resealed, the old target's log-likelihood scored under the new manifest's key). A path
    named by the content cannot be another content's. A file the manifest does not list is read where it is."""
    root = golden.path.resolve()
    entry = golden.manifest.files.get(src.relative_to(root).as_posix()) if src.is_relative_to(root) else None
    if entry is None:
        return src
    dest = content_path("golden-data", entry.sha256, src.suffix)
    if _holds(dest, entry.sha256):
        return dest
    data = read_user_file(src, "golden data file", MAX_SET_FILE_BYTES, hint=HINT)
    if sha256_bytes(data) != entry.sha256:
        raise UsageError(f"{src} changed after the golden set {golden.path} was verified; {HINT}")
    return _stored(dest, data)


def _holds(dest: Path, sha: str) -> bool:
    return dest.is_file() and not dest.is_symlink() and sha256_file(dest) == sha


def _stored(dest: Path, data: bytes) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(dest) as tmp:
        tmp.write_bytes(data)
    return dest


def _verified_config(golden: GoldenSet, name: str) -> Any:
    """A task YAML as lm-eval will get it, from bytes that hash to the manifest's entry: it was read from disk
    again after verify, and a YAML edited in between was scored and cached under the verified manifest's sha (a
    review's repro: a changed target, acc cached 0.25 where the set gives 0.42)."""
    path = golden.path / name
    raw = read_user_file(path, "golden task file", MAX_YAML_BYTES, hint=HINT)
    if sha256_bytes(raw) != golden.manifest.files[name].sha256:
        raise UsageError(f"{path} changed after the golden set {golden.path} was verified; {HINT}")
    return parse_yaml(raw, str(path))


def _check_metrics(name: str, cfg: Any, metrics: set[str]) -> None:
    """Every metric a task YAML names is one lm-eval defines (compat.registered_metrics), never looked up with HF
    evaluate: `hf_evaluate: true`, or any other name, makes lm-eval import a Python file of that name or path."""
    for m in (cfg.get("metric_list") or []) if isinstance(cfg, dict) else []:
        metric = m.get("metric") if isinstance(m, dict) else m
        if not isinstance(metric, str) or metric not in metrics or (isinstance(m, dict) and m.get("hf_evaluate")):
            raise UsageError(
                f"{name}: metric {str(metric)[:80]!r} is not one lm-eval defines ({', '.join(sorted(metrics))}); "
                "lm-eval would load it with HF evaluate, which imports a Python file of that name: a golden set "
                "runs no code. Name one of those metrics"
            )


def lm_eval_tasks(golden: GoldenSet, into: Path, ids: dict[str, list[str]] | None, metrics: set[str]) -> Path:
    """Write the task YAMLs into `into` with absolute data paths (lm-eval resolves them from the
    working directory), optionally restricted to some item ids per task, each data file a copy named by its
    bytes (`addressed`), each YAML from bytes that hash to the manifest (`_verified_config`) and naming only
    `metrics` (compat.lm_eval.registered_metrics: lm-eval's own; the caller also renders templates sandboxed,
    compat.lm_eval.sandbox_templates, before lm-eval loads them). Returns the include path."""
    import yaml

    into.mkdir(parents=True, exist_ok=True)
    for name in golden.manifest.files:
        if not name.startswith("tasks/"):
            continue
        cfg = _verified_config(golden, name)
        _check_metrics(name, cfg, metrics)
        files = data_files(cfg)
        if files and "task" in cfg:
            for split in files:
                files[split] = str(addressed(golden, (golden.path / "tasks" / files[split]).resolve()))
            if ids is not None and cfg["task"] in ids:
                keep = {items.id_key(i) for i in ids[cfg["task"]]}  # as verify matched them: NFC, stripped
                id_field = golden.item_key(cfg["task"])[0]
                scored = scored_split(cfg)  # verify: named in data_files (a freeze may score `validation`)
                source = user_lines(files[scored], "golden data file", MAX_SET_FILE_BYTES, MAX_ITEM_BYTES, hint=HINT)
                with source as lines:
                    kept = b"".join(
                        raw + b"\n"
                        for n, raw in lines
                        if items.id_key(json.loads(lines.text(n, raw))[id_field]) in keep
                    )
                # the subset named by its bytes too: the same subset is one path (one entry in datasets' cache,
                # where a fresh path each run added one every run), another subset another path
                sha = sha256_bytes(kept)
                subset = content_path("golden-data", sha, ".jsonl")
                files[scored] = str(subset if _holds(subset, sha) else _stored(subset, kept))
        (into / Path(name).name).write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return into
