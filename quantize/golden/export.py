"""A golden set's tasks as a standalone lm-eval task folder (`quantize golden export SUITE OUT`): the YAMLs
`manifest.lm_eval_tasks` writes for scoring, with every data file they read copied into OUT/data/ and named by
its absolute path there (lm-eval's json loader resolves a relative `data_files` from the working directory, not
from the YAML), so a team runs lm-eval against its own engine (vLLM, SGLang, an OpenAI-compatible server) on
exactly the items quantize scores, and gates lm-eval's own samples (`quantize gate POLICY --candidate RESULTS`,
quantize/evaluate/samples.py).

The folder is written whole or not at all (a temporary folder beside OUT, renamed into place), with a record of
its own (EXPORT_RECORD: every file it wrote and its sha256); an existing OUT is refused unless `force`, and even
then only an earlier export is replaced: a folder whose record reads and whose files are exactly the recorded
ones, unchanged. A folder of the user's own YAML files (recipes) looked like an export to the earlier rule (task
YAMLs and data/*.jsonl) and was deleted by `--force` (a review). An OUT inside a golden-set version (a folder
holding its MANIFEST.json, at any depth above OUT) is refused: a version is immutable.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, field_validator

from quantize.compat.lm_eval import sandboxed_metrics
from quantize.config import parse_yaml
from quantize.errors import UsageError
from quantize.golden.items import MAX_ITEM_BYTES, MAX_SET_FILE_BYTES
from quantize.golden.manifest import HINT, MANIFEST_FILE, GoldenSet, data_files, lm_eval_tasks, scored_split
from quantize.io import atomic_dir, read_user_file, sha256_file, user_lines
from quantize.names import checked

MAX_TASK_YAML_BYTES = 2**20  # a YAML lm_eval_tasks wrote: a few hundred bytes
EXPORT_RECORD = "quantize-export.json"  # what an export wrote (lm-eval's --include_path reads only its YAMLs)
MAX_RECORD_BYTES = 2**20
WRITTEN = re.compile(r"(?!\.)[^/\\]+\.yaml|data/(?!\.)[^/\\]+\.jsonl")  # the paths an export writes, in the folder
SHA256 = re.compile(r"[0-9a-f]{64}")


class ExportRecord(BaseModel):
    """EXPORT_RECORD: what `golden export` wrote into the folder (each file by its path there, and its sha256), and
    of which golden set. A path is one an export writes (a task YAML, data/*.jsonl): a record naming another (`../x`)
    does not read."""

    model_config = ConfigDict(extra="forbid")

    written_by: Literal["quantize golden export"] = "quantize golden export"
    golden: str
    files: dict[str, str]

    @field_validator("files")
    @classmethod
    def _written(cls, files: dict[str, str]) -> dict[str, str]:
        for name, digest in files.items():
            if not (WRITTEN.fullmatch(name) and SHA256.fullmatch(digest)):
                raise ValueError(f"{name!r}: {digest!r} is no file an export writes and its sha256")
        return files


@dataclass(frozen=True)
class Exported:
    """What `golden export` wrote: the folder, the suite's tasks with the items each holds, the golden set's
    name/version and whether the smoke subset was taken, the seed lm-eval must be run with and the suite's context
    window (None: the model's)."""

    out: Path
    tasks: dict[str, int]
    golden: str
    smoke: bool
    seed: int
    max_length: int | None = None


def export_tasks(
    golden: GoldenSet,
    out: Path,
    tasks: list[str],
    ids: dict[str, list[str]] | None,
    run: tuple[int, int | None],
    force: bool = False,
) -> Exported:
    """Write `golden`'s task YAMLs and data into `out` atomically (module docstring). `tasks`: the suite's tasks
    (what the printed command runs); `ids`: the smoke subset's ids per task, or None for every item; `run`: the
    suite's seed and context window (max_length, None: the model's), which the printed commands pass on."""
    out = Path(out)
    _not_in_a_golden_set(out)
    _check_out(out, force)
    final = out.resolve()
    with tempfile.TemporaryDirectory(prefix="quantize-export-") as scratch, atomic_dir(out, replace=force) as tmp:
        include = lm_eval_tasks(golden, Path(scratch), ids, sandboxed_metrics())
        (tmp / "data").mkdir()
        counts: dict[str, int] = {}
        for src in sorted(include.glob("*.yaml")):
            cfg = parse_yaml(read_user_file(src, "exported task file", MAX_TASK_YAML_BYTES), str(src))
            files = data_files(cfg)
            if files and "task" in cfg:
                for split, path in files.items():
                    name = f"{checked(cfg['task'], 'task', HINT)}.{checked(split, 'split', HINT)}.jsonl"  # verified
                    n = _copy(Path(path), tmp / "data" / name, golden)
                    files[split] = str(final / "data" / name)
                    if split == scored_split(cfg):  # the items lm-eval scores (a freeze may score validation)
                        counts[cfg["task"]] = n
            (tmp / src.name).write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True), encoding="utf-8")
        _write_record(tmp, golden)
    m = golden.manifest
    return Exported(out, {t: counts[t] for t in tasks}, f"{m.name}/{m.version}", ids is not None, *run)


def _written(folder: Path) -> dict[str, str]:
    """Every file an export holds, by its path in the folder, and its sha256: the task YAMLs and data/*.jsonl."""
    files = [*sorted(folder.glob("*.yaml")), *sorted((folder / "data").glob("*.jsonl"))]
    return {f.relative_to(folder).as_posix(): sha256_file(f) for f in files}


def _write_record(folder: Path, golden: GoldenSet) -> None:
    m = golden.manifest
    record = ExportRecord(golden=f"{m.name}/{m.version}", files=_written(folder))
    (folder / EXPORT_RECORD).write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")


def _not_in_a_golden_set(out: Path) -> None:
    """OUT is no golden-set version, nor inside one (a folder holding its MANIFEST.json, at any depth above OUT): a
    version is immutable, and an export written into it was files its MANIFEST does not list (a review's
    `golden export suite.yaml golden/v1/x`)."""
    where = out.resolve()  # links and `..` resolved: the folder the export would be written in
    for folder in (where, *where.parents):
        if (folder / MANIFEST_FILE).is_file():
            raise UsageError(
                f"{out} is inside the golden-set version {folder} (it holds {MANIFEST_FILE}), and a version is "
                "immutable: an export there would add files its manifest does not list. Choose a folder outside it"
            )


def _check_out(out: Path, force: bool) -> None:
    """OUT may be written: absent, or with `force` an earlier export (module docstring): its record reads, and it
    holds exactly the files the record lists (regular files, no links, nothing else), each unchanged."""
    if not (out.exists() or out.is_symlink()):
        return
    if not force:
        raise UsageError(f"{out} exists; choose another folder, or pass --force to replace an earlier export there")
    if out.is_symlink() or not out.is_dir():
        raise UsageError(f"{out} is not a folder an export wrote (a file or a link); --force replaces only those")
    why = "--force replaces only an earlier export of quantize's. Choose another folder"
    try:
        raw = read_user_file(out / EXPORT_RECORD, "export record", MAX_RECORD_BYTES, follow_links=False)
        files = ExportRecord.model_validate_json(raw.decode("utf-8")).files
    except (UsageError, ValueError):  # unreadable, not UTF-8, not the record (ValidationError): no export of ours
        raise UsageError(
            f"{out} holds no export record ({EXPORT_RECORD}) that reads: no export wrote it; {why}"
        ) from None
    held = {
        p.relative_to(out).as_posix()
        for p in [*out.iterdir(), *((out / "data").iterdir() if _plain_dir(out / "data") else [])]
        if p.name != EXPORT_RECORD and not (p.name == "data" and p.parent == out and _plain_dir(p))
    }
    if foreign := sorted(held - set(files)):
        raise UsageError(f"{out} holds {', '.join(foreign[:3])}, which its export did not write; {why}")
    for name, digest in files.items():
        f = out / name
        if f.is_symlink() or not f.is_file() or sha256_file(f) != digest:
            raise UsageError(f"{out}/{name} is not the file its export wrote (changed, gone or a link); {why}")


def _plain_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink()


def _copy(src: Path, dst: Path, golden: GoldenSet) -> int:
    """A data file copied through the one reader (a regular file, capped, line by line); a file of the golden set
    itself must still hash to its manifest entry (it was verified, and may not change between). Returns its lines."""
    entry = None
    if src.is_relative_to(golden.path.resolve()):
        entry = golden.manifest.files.get(src.relative_to(golden.path.resolve()).as_posix())
    count = 0
    with (
        user_lines(src, "golden data file", MAX_SET_FILE_BYTES, MAX_ITEM_BYTES, hint=HINT) as lines,
        dst.open("wb") as f,
    ):
        for _, raw in lines:
            f.write(raw + b"\n")
            count += 1
        digest = lines.hexdigest()
    if entry is not None and digest != entry.sha256:
        raise UsageError(f"{src} changed after the golden set {golden.path} was verified; {HINT}")
    return count


def export_text(e: Exported, suite: str) -> str:
    """What `golden export` prints: what it wrote and the lm-eval command lines that score an engine on it (the
    seeds quantize scores with, samples kept), then the gate that reads those samples."""
    tasks = ",".join(e.tasks)
    items = ", ".join(f"{t} ({n} items)" for t, n in e.tasks.items())
    subset = ", the smoke subset" if e.smoke else ""
    out = shlex.quote(str(e.out))
    common = f"--include_path {out} --tasks {tasks} --log_samples --output_path RESULTS --seed {e.seed}"
    window = f",max_length={e.max_length}" if e.max_length else ""
    return (
        f"{e.out}: wrote the lm-eval tasks of suite {suite} (golden {e.golden}{subset}): {items}\n"
        f"\n"
        f"Score an engine with lm-eval, keeping its samples (--log_samples) and quantize's seeds (--seed {e.seed}: "
        f"every seed {e.seed}, as quantize scores):\n"
        f"  vLLM in-process:\n"
        f"    lm_eval --model vllm --model_args pretrained=MODEL{window} {common}\n"
        f"  transformers:\n"
        f"    lm_eval --model hf --model_args pretrained=MODEL{window} {common}\n"
        f"  an OpenAI-compatible server (vLLM serve, SGLang, ...; log-likelihood tasks need prompt logprobs):\n"
        f"    lm_eval --model local-completions --model_args "
        f"base_url=http://HOST:PORT/v1/completions,model=NAME,tokenizer=TOKENIZER{window} {common}\n"
        f"\n"
        f"Then gate what the engine computed (RESULTS: lm-eval's output folder; no agreement rules, which need "
        f"logits):\n"
        f"  quantize gate POLICY --baseline BASELINE --candidate RESULTS"
    )
