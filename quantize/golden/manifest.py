"""Verify a golden-set version against its MANIFEST, and hand its tasks to lm-eval.

A version folder is immutable: every file is listed in MANIFEST.json with its sha256 and item
count, and any difference (a changed byte, a missing or unlisted file) is an error naming the
file. Scoring calls `verify` first and refuses an unverified set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantize.config import Wording, validate
from quantize.errors import UsageError
from quantize.io import sha256_bytes
from quantize.kinds import KINDS, OUTPUT_TYPES, metric_name

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
    task_version: float | str
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
        import yaml

        cfg = yaml.safe_load((self.path / "tasks" / f"{task}.yaml").read_text(encoding="utf-8")) or {}
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
    root = Path(path)
    mpath = root / "MANIFEST.json"
    if not mpath.is_file():
        raise UsageError(f"{root} is not a golden-set version: it has no MANIFEST.json (expected e.g. golden/core/v1)")
    raw = mpath.read_bytes()
    hint = "restore it from version control"
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UsageError(f"{mpath} is not a valid manifest: not JSON ({str(e)[:200]}); {hint}") from None
    manifest = validate(Manifest, data, str(mpath), "golden-set manifest", Wording(regenerate=hint))
    files = manifest.files
    problems = []
    for name, entry in sorted(files.items()):
        p = root / name
        if not p.is_file():
            problems.append(f"{name}: listed in the manifest but missing")
            continue
        blob = p.read_bytes()
        if sha256_bytes(blob) != entry.sha256:
            problems.append(f"{name}: sha256 differs from the manifest (the file was changed)")
        elif entry.items is not None and (n := blob.count(b"\n")) != entry.items:
            problems.append(f"{name}: {n} items, the manifest says {entry.items}")
    problems += _outside_reads(root, manifest)
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
    return GoldenSet(root, manifest, sha256_bytes(raw), task_entries(root, manifest))


def _outside_reads(root: Path, manifest: Manifest) -> list[str]:
    """What the task YAMLs would read beyond the version folder: every task reads local JSON (`dataset_path:
    json`) from `data_files` that resolve inside the folder and are listed in the manifest; no `include:`. A set
    that verifies therefore holds all its data, and editing a file it reads changes a hash it is checked by."""
    import yaml

    problems = []
    for name in sorted(n for n in manifest.files if n.startswith("tasks/")):
        try:
            cfg = yaml.safe_load((root / name).read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
            problems.append(f"{name}: not plain YAML a golden set can check ({str(e)[:80]})")
            continue
        if isinstance(cfg, dict) and "group" in cfg:
            members = cfg.get("task") if isinstance(cfg.get("task"), list) else [cfg.get("task")]
            if not all(isinstance(m, str) for m in members):
                problems.append(f"{name}: a group that defines tasks inline; a group names the set's task files")
            continue  # a group file names tasks, it reads no data
        if not isinstance(cfg, dict) or "task" not in cfg:
            continue
        if "include" in cfg:
            problems.append(f"{name}: `include: {cfg['include']}` pulls in a file the manifest does not check")
        if cfg.get("dataset_path") != "json":
            problems.append(f"{name}: dataset_path {cfg.get('dataset_path')!r}; a golden task reads its own JSON")
        files = (cfg.get("dataset_kwargs") or {}).get("data_files")
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


def task_entries(root: Path, manifest: Manifest) -> dict[str, TaskEntry]:
    """Each task's entry, read once. core/v1 predates task entries: its tasks are tasks/*.yaml but the
    group's, its items data/<task without the group prefix>.jsonl with `id` and `cluster` fields."""
    if manifest.tasks:
        return dict(manifest.tasks)
    import yaml

    group, out = manifest.group, {}
    for n in manifest.files:
        task = Path(n).stem
        if n.startswith("tasks/") and task != group:
            try:
                kind = yaml.safe_load((root / n).read_text(encoding="utf-8"))["output_type"]
                out[task] = TaskEntry(
                    data=f"data/{task.removeprefix(f'{group}_')}.jsonl", output_type=kind, cluster_field="cluster"
                )
            except (yaml.YAMLError, UnicodeDecodeError, TypeError, KeyError, ValueError) as e:
                raise UsageError(
                    f"{root / n} is not an lm-eval task YAML with a supported output_type ({str(e)[:120]}); "
                    "restore it from version control"
                ) from None
    return out


def read_items(golden: GoldenSet, task: str) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in (golden.path / golden.entry(task).data).read_text(encoding="utf-8").splitlines()
    ]


def item_id(doc: dict[str, Any], key: tuple[str, str | None]) -> tuple[str, str]:
    """(id, cluster) of an item; an item without a cluster field is its own cluster."""
    i = str(doc[key[0]])
    return i, (str(doc[key[1]]) if key[1] else i)


def lm_eval_tasks(golden: GoldenSet, into: Path, ids: dict[str, list[str]] | None = None) -> Path:
    """Write the task YAMLs into `into` with absolute data paths (lm-eval resolves them from the
    working directory), optionally restricted to some item ids per task. Returns the include path."""
    import yaml

    into.mkdir(parents=True, exist_ok=True)
    for name in golden.manifest.files:
        if not name.startswith("tasks/"):
            continue
        cfg = yaml.safe_load((golden.path / name).read_text())
        files = (cfg.get("dataset_kwargs") or {}).get("data_files")
        if files and "task" in cfg:
            for split in files:
                files[split] = str((golden.path / "tasks" / files[split]).resolve())
            if ids is not None and cfg["task"] in ids:
                keep = set(ids[cfg["task"]])
                id_field = golden.item_key(cfg["task"])[0]
                subset = into / f"{cfg['task']}.jsonl"
                subset.write_text(
                    "".join(
                        line + "\n"
                        for line in Path(files["test"]).read_text(encoding="utf-8").splitlines()
                        if str(json.loads(line)[id_field]) in keep
                    ),
                    encoding="utf-8",
                )
                files["test"] = str(subset)
        (into / Path(name).name).write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return into
