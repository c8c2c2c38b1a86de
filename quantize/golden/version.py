"""Write a golden-set version folder for `golden new` and `golden freeze`: items (JSONL), one lm-eval task
YAML per task that reads only the local files, a group YAML, and the MANIFEST (sha256 and item count of
every file, task entries, fixed smoke ids, sources). Written into a temporary folder and renamed into
place (quantize/io.py): a version folder either exists complete or not at all.

    golden/<name>/<version>/
        MANIFEST.json
        data/<task>.jsonl            the items, one JSON object per line
        data/<task>.fewshot.jsonl    the few-shot examples pinned into the items, when the task uses any
        tasks/<task>.yaml            lm-eval task config: dataset_path json, data_files ../data/...
        tasks/<group>.yaml           the group of every task
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantize.errors import UsageError
from quantize.golden.manifest import Manifest
from quantize.io import atomic_dir, sha256_bytes
from quantize.names import checked, shown, unique

SMOKE = 8  # fixed smoke ids per task


@dataclass
class TaskFiles:
    """One task of a version: its items, its lm-eval config (without the dataset part) and how items are keyed."""

    name: str
    output_type: str
    items: list[dict[str, Any]]
    config: dict[str, Any]
    id_field: str = "id"
    cluster_field: str | None = None
    fewshot: list[dict[str, Any]] | None = None
    source: dict[str, Any] = field(default_factory=dict)


def jsonl(items: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(it, ensure_ascii=False, sort_keys=True) + "\n" for it in items).encode("utf-8")


def yaml_bytes(data: dict[str, Any]) -> bytes:
    """YAML as every set writes it; an object that appears twice is written out twice, never as an alias (verify
    reads task YAMLs with the project's limits, which refuse aliases)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=120).encode("utf-8")


def check_new_version(out: Path) -> None:
    """A version folder is written once: refuse an existing one before any work. Its name and its set's (the folder
    above) become the manifest's name, version and group file: each is checked as a path part (quantize/names.py)."""
    where, given = "--out golden/SET/VERSION, e.g. golden/faq/v1", f"--out {shown(str(out), 200)}"
    checked(out.name, f"{given}: the version", f"give {where}")
    checked(out.parent.name, f"{given}: the set (the folder above the version)", f"give {where}")
    if out.is_symlink():
        raise UsageError(f"--out {out} is a link; name the new version folder itself, e.g. golden/faq/v1")
    if out.exists():
        raise UsageError(
            f"{out} exists: a golden version is immutable. Write a new version folder (e.g. "
            f"{out.parent / _next_version(out.name)})"
        )
    for parent in out.absolute().parents:  # the first that exists must be a folder (not a file named like the set)
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {out}: {parent} is a file, so no version folder can be made below it")
            break
    if not out.parent.name or out.name in ("data", "tasks"):
        raise UsageError(f"--out {out}: name a version folder inside a set folder, e.g. golden/faq/v1")


def check_task_names(names: list[str]) -> None:
    """Each task's name names its files (data/<task>.jsonl, tasks/<task>.yaml): one path part each, no two alike."""
    for n in names:
        checked(n, "a task's name (it names data/<task>.jsonl and tasks/<task>.yaml)", "rename the task")
    unique([(n, f"task {n}") for n in names], "tasks of this set", "rename one of them")


def _next_version(name: str) -> str:
    return f"v{int(name[1:]) + 1}" if name.startswith("v") and name[1:].isdigit() else f"{name}-2"


def write_version(
    out: Path,
    tasks: list[TaskFiles],
    sources: dict[str, Any],
    builder: dict[str, Any],
    note: str | None = None,
    seed: int = 0,
    check: Callable[[Path], None] | None = None,
) -> Manifest:
    """Write the version folder of `golden new` and `golden freeze` (through `write_files`); returns the manifest.
    `check`: called on the complete temporary folder before it is renamed into place (raising keeps it out)."""
    name = out.parent.name
    check_task_names([t.name for t in tasks])
    group = name if name not in {t.name for t in tasks} else f"{name}_set"
    files: dict[str, bytes] = {}
    entries: dict[str, dict[str, Any]] = {}
    smoke: dict[str, list[str]] = {}
    versions = set()
    for t in tasks:
        data_files = {"test": f"../data/{t.name}.jsonl"}
        entry: dict[str, Any] = {
            "data": f"data/{t.name}.jsonl",
            "output_type": t.output_type,
            "id_field": t.id_field,
            "cluster_field": t.cluster_field,
            "source": t.source,
        }
        files[entry["data"]] = jsonl(t.items)
        cfg = {"task": t.name, "dataset_path": "json", "dataset_kwargs": {"data_files": data_files}}
        cfg["test_split"] = "test"
        if t.fewshot is not None:  # the pinned examples' own file, read by no task (quantize/golden/prompts.py)
            entry["fewshot"] = f"data/{t.name}.fewshot.jsonl"
            entry["fewshot_ids"] = [f"{t.name}-fewshot-{i:05d}" for i in range(len(t.fewshot))]
            files[entry["fewshot"]] = jsonl(t.fewshot)
        cfg |= t.config
        cfg.setdefault("metadata", {}).setdefault("version", 1.0)
        versions.add(cfg["metadata"]["version"])
        files[f"tasks/{t.name}.yaml"] = yaml_bytes(cfg)
        entries[t.name] = entry
        ids = [str(it[t.id_field]) for it in t.items]
        smoke[t.name] = random.Random(f"{seed}:smoke:{t.name}").sample(ids, min(SMOKE, len(ids)))
    files[f"tasks/{group}.yaml"] = yaml_bytes(
        {"group": group, "task": [t.name for t in tasks], "metadata": {"version": 1.0}}
    )
    fields = {
        "name": name,
        "version": out.name,
        "group": group,
        "task_version": versions.pop() if len(versions) == 1 else "per task (tasks/*.yaml)",
        "seed": seed,
        "builder": builder,
        "sources": sources,
        "tasks": entries,
        "smoke_ids": smoke,
        "note": note,
    }
    return write_files(out, files, fields, check)


def write_files(
    out: Path, files: dict[str, bytes], fields: dict[str, Any], check: Callable[[Path], None] | None = None
) -> Manifest:
    """The one writer of a version folder (`golden new`, `golden freeze` and core's builder): every file, and
    MANIFEST.json = `fields` plus the sha256 and item count (JSONL lines) of each file, written into a temporary
    folder and renamed into place (quantize/io.py). Returns the manifest, validated as every reader validates it."""
    manifest = {
        **fields,
        "files": {
            n: {"sha256": sha256_bytes(b), "items": b.count(b"\n") if n.endswith(".jsonl") else None}
            for n, b in sorted(files.items())
        },
    }
    checked = Manifest.model_validate(manifest)  # a writer's mistake is found here, before anything is written
    with atomic_dir(out) as tmp:
        for n, blob in files.items():
            p = tmp / n
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(blob)
        (tmp / "MANIFEST.json").write_text(
            json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        if check is not None:
            check(tmp)
    return checked
