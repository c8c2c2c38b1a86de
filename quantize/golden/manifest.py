"""Verify a golden-set version against its MANIFEST, and hand its tasks to lm-eval.

A version folder is immutable: every file is listed in MANIFEST.json with its sha256 and item
count, and any difference (a changed byte, a missing or unlisted file) is an error naming the
file. Scoring calls `verify` first and refuses an unverified set.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from quantize.config import validate
from quantize.errors import UsageError


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    items: int | None = Field(None, ge=0, description="lines of a .jsonl file; null for other files")


class Manifest(BaseModel):
    """MANIFEST.json of a golden-set version: what `verify` checks every file against."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    group: str
    task_version: float | str
    files: dict[str, FileEntry] = Field(min_length=1)
    smoke_ids: dict[str, list[str]] = Field(default_factory=dict)
    seed: int | None = None
    sources: dict[str, Any] = Field(default_factory=dict)
    builder: dict[str, Any] = Field(default_factory=dict)
    note: str | None = None

    @field_validator("files")
    @classmethod
    def _inside(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in files:
            parts = Path(name).parts
            if Path(name).is_absolute() or ".." in parts or not parts or parts[0] not in ("data", "tasks"):
                raise ValueError(f"file {name!r} is not inside the version folder's data/ or tasks/")
        return files


@dataclass(frozen=True)
class GoldenSet:
    path: Path
    manifest: dict[str, Any]
    manifest_sha256: str

    @property
    def tasks(self) -> list[str]:
        return sorted(
            Path(n).stem
            for n in self.manifest["files"]
            if n.startswith("tasks/") and Path(n).stem != self.manifest["group"]
        )

    def provenance(self) -> dict[str, Any]:
        return {
            "name": self.manifest["name"],
            "version": self.manifest["version"],
            "path": str(self.path),
            "manifest_sha256": self.manifest_sha256,
            "task_version": self.manifest["task_version"],
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
    manifest = validate(Manifest, data, str(mpath), "golden-set manifest", regenerate=hint).model_dump()
    files = manifest["files"]
    problems = []
    for name, entry in sorted(files.items()):
        p = root / name
        if not p.is_file():
            problems.append(f"{name}: listed in the manifest but missing")
            continue
        blob = p.read_bytes()
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            problems.append(f"{name}: sha256 differs from the manifest (the file was changed)")
        elif entry.get("items") is not None and (n := blob.count(b"\n")) != entry["items"]:
            problems.append(f"{name}: {n} items, the manifest says {entry['items']}")
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
    return GoldenSet(root, manifest, hashlib.sha256(raw).hexdigest())


def read_items(golden: GoldenSet, task: str) -> list[dict[str, Any]]:
    name = task.removeprefix(f"{golden.manifest['group']}_")
    return [
        json.loads(line) for line in (golden.path / "data" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    ]


def lm_eval_tasks(golden: GoldenSet, into: Path, ids: dict[str, list[str]] | None = None) -> Path:
    """Write the task YAMLs into `into` with absolute data paths (lm-eval resolves them from the
    working directory), optionally restricted to some item ids per task. Returns the include path."""
    import yaml

    into.mkdir(parents=True, exist_ok=True)
    for name in golden.manifest["files"]:
        if not name.startswith("tasks/"):
            continue
        cfg = yaml.safe_load((golden.path / name).read_text())
        files = (cfg.get("dataset_kwargs") or {}).get("data_files")
        if files:
            data = (golden.path / "tasks" / files["test"]).resolve()
            if ids is not None and cfg["task"] in ids:
                keep = set(ids[cfg["task"]])
                subset = into / f"{cfg['task']}.jsonl"
                subset.write_text(
                    "".join(
                        line + "\n"
                        for line in data.read_text(encoding="utf-8").splitlines()
                        if json.loads(line)["id"] in keep
                    ),
                    encoding="utf-8",
                )
                data = subset
            files["test"] = str(data)
        (into / Path(name).name).write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return into
