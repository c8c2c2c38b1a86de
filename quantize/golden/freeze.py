"""`quantize golden freeze --task T [--include-path DIR] --out OUT`: an lm-eval task, frozen.

lm-eval loads a task's documents when it runs (from a hub, or a local file that may change); a frozen
golden set holds them. Freezing loads the task through lm-eval once, takes its evaluation documents
after its own filtering and `process_docs`, and writes them as JSONL beside a task YAML that reads
only that file, so the set scores the same way offline and forever:

    kept        doc_to_text / doc_to_target / doc_to_choice templates, delimiters, description,
                generation_kwargs, filter_list, metric_list, metadata.version
    replaced    the dataset (dataset_path json, data_files ../data/<task>.jsonl), process_docs (already
                applied), few-shot sampling: each item's prompt prefix as lm-eval's own full run drew it is
                pinned into the item (quantize/golden/prompts.py), the examples kept in
                data/<task>.fewshot.jsonl, and the task frozen zero-shot over that prefix
    refused     Python in a template, metric, filter or process_results (a golden set holds data and
                templates; it never runs code)

Every freeze ends by loading the written set through lm-eval and comparing each item's prompt with the
original task's, before the folder is renamed into place.

Each item gets a stable id (`golden_id`, <task>-<index>, or the field --id-field names) and, with
--cluster-field, a cluster (e.g. MMLU's subject): items that share one are not independent.
"""

from __future__ import annotations

import platform
import re
import shlex
import stat
from pathlib import Path
from typing import Any

from quantize.compat import hub
from quantize.config import MAX_YAML_BYTES
from quantize.errors import UsageError
from quantize.golden.manifest import Manifest
from quantize.golden.prompts import CONTEXT_FIELD, LM_EVAL_FEWSHOT_SEED, SHOTS_FIELD, check_prompts, pin_shots, prompts
from quantize.golden.version import TaskFiles, check_new_version, check_task_names, write_version
from quantize.io import read_user_text, sha256_file
from quantize.kinds import OUTPUT_TYPES

ID_FIELD = "golden_id"
LOCAL_BUILDERS = ("json", "parquet", "csv", "text", "arrow")  # datasets' loaders of local files (hashed instead)
# the parts of a task config a frozen task keeps; the dataset part is written anew
KEEP = (
    "output_type",
    "description",
    "doc_to_text",
    "doc_to_target",
    "doc_to_choice",
    "target_delimiter",
    "fewshot_delimiter",
    "gen_prefix",
    "num_fewshot",
    "generation_kwargs",
    "filter_list",
    "metric_list",
    "repeats",
    "multiple_input",
)
CODE_HINT = (
    "a golden set holds data and templates only, so it scores the same forever without running code: write "
    "the field as a Jinja template over the document's fields (compute new fields in process_docs, which "
    "freeze runs once)"
)


def _callables(value: Any, where: str) -> list[str]:
    if callable(value):
        return [where]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _callables(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _callables(v, f"{where}[{i}]")]
    return []


OFFLINE_ROUTES = (
    "Freezing runs offline, and datasets reads a hub dataset offline only from its own cache (a `load_dataset` "
    "run while online), not from a `hf download` snapshot folder. Two routes work: run `load_dataset` for it "
    "once where the hub is reachable and copy the datasets cache (HF_DATASETS_CACHE), or point the task at local "
    "files: a YAML in your --include-path folder with `include: <the task's YAML>`, `dataset_path: parquet` "
    "(or json), `dataset_name: null` and `dataset_kwargs: {data_files: {test: /path/test.parquet, ...}}` "
    "(a snapshot's parquet files serve as they are)"
)


MAX_INCLUDE_YAMLS = 10_000  # task YAMLs in an --include-path folder (lm-eval's own tasks are about 8,000)
MAX_INCLUDE_YAML_BYTES = 2**20  # one task YAML: a few hundred bytes to a few KB


def check_include_path(folder: Path) -> None:
    """Every file lm-eval's task index will read from an --include-path folder (its `**/*.yaml`, as
    lm_eval.tasks._index walks it) is a regular file of at most MAX_INCLUDE_YAML_BYTES, and there are at most
    MAX_INCLUDE_YAMLS of them: a FIFO named t.yaml blocked the freeze in lm-eval's open forever (a review)."""
    for n, p in enumerate(folder.glob("**/*.yaml")):
        if n >= MAX_INCLUDE_YAMLS:
            raise UsageError(
                f"--include-path {folder} holds more than {MAX_INCLUDE_YAMLS:,} task YAMLs; give the folder of the "
                "tasks to freeze"
            )
        try:
            st = p.stat()
        except OSError as e:
            raise UsageError(f"--include-path {folder}: {p} cannot be read ({e.strerror}); remove or fix it") from None
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_INCLUDE_YAML_BYTES:
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"{st.st_size:,} bytes"
            raise UsageError(
                f"--include-path {folder}: {p} is {what}; lm-eval reads every *.yaml there as a task (regular files "
                f"of at most {MAX_INCLUDE_YAML_BYTES:,} bytes): remove it, or give a folder holding only task YAMLs"
            )


def _task_manager(names: list[str], include_path: Path | None) -> Any:
    """lm-eval's task index: the --include-path folder added to lm-eval's own tasks, as lm-eval's own
    --include_path adds it (a name the folder defines wins). lm-eval's index of its own tasks takes seconds, so
    it is built only when a name is not in the folder."""
    if include_path is not None:
        if not include_path.is_dir():
            raise UsageError(f"--include-path {include_path} is not a folder of lm-eval task YAMLs")
        check_include_path(include_path)
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        tm = TaskManager(include_path=str(include_path), include_defaults=False)
        if all(n in tm.all_tasks for n in names):
            return tm
    return TaskManager(include_path=str(include_path) if include_path else None, include_defaults=True)


def load_tasks(names: list[str], include_path: Path | None) -> dict[str, Any]:
    """lm-eval's task objects, groups expanded to their tasks; an unknown task or a dataset that
    cannot be read offline is a usage error."""
    import difflib

    from lm_eval.tasks import get_task_dict

    tm = _task_manager(names, include_path)
    for name in names:
        if name not in tm.all_tasks:
            close = difflib.get_close_matches(name, tm.all_tasks, n=3)
            where = f"in {include_path} or among lm-eval's tasks" if include_path else "among lm-eval's tasks"
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(
                f"--task {name}: no such task {where}{hint} (a task YAML's `task:` names it; pass its folder "
                "with --include-path)"
            )
    with hub.offline() as off:  # offline for an API call too, which no variable set before the imports says
        try:
            loaded = get_task_dict(names, tm)
        except (OSError, ValueError, ConnectionError, ImportError, KeyError) as e:
            routes = OFFLINE_ROUTES if off else "The Hub's libraries were online, as the environment says"
            raise UsageError(
                f"lm-eval could not load {', '.join(names)}: {type(e).__name__}: {str(e)[:300]}. {routes}"
            ) from None
    leaves: dict[str, Any] = {}

    def walk(d: dict[Any, Any]) -> None:
        for v in d.values():
            if isinstance(v, dict):
                walk(v)
            else:
                leaves[v.config.task] = v

    walk(loaded)
    return leaves


def _plain(doc: Any, where: str) -> dict[str, Any]:
    import json

    d = dict(doc)
    try:
        json.dumps(d, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise UsageError(
            f"{where} holds a value JSON cannot store ({str(e)[:120]}); only text tasks can be frozen"
        ) from None
    return d


def freeze_task(
    task: Any, id_field: str | None, cluster_field: str | None, fewshot_seed: int = LM_EVAL_FEWSHOT_SEED
) -> tuple[TaskFiles, dict[int, list[str]]]:
    """A task's frozen files, and every document's prompts in the original task's full run (for check_prompts)."""
    name = task.config.task
    cfg = task.config.to_dict(keep_callable=True)
    kind = cfg.get("output_type")
    if kind not in OUTPUT_TYPES:
        raise UsageError(f"task {name} has output_type {kind!r}; the gate scores {', '.join(OUTPUT_TYPES)}")
    code = [p for k in (*KEEP, "process_results") for p in _callables(cfg.get(k), k)]
    if code:
        raise UsageError(f"task {name}: {', '.join(code)} is Python code; {CODE_HINT}")
    docs = [_plain(d, f"task {name} document {i}") for i, d in enumerate(task.eval_docs)]
    if not docs:
        raise UsageError(f"task {name} has no evaluation documents after its filtering")
    for f, flag in ((id_field, "--id-field"), (cluster_field, "--cluster-field")):
        if (
            f is not None
            and (missing := next((i for i, d in enumerate(docs) if d.get(f) in (None, "")), None)) is not None
        ):
            raise UsageError(
                f"{flag} {f}: document {missing} of task {name} has no {f!r} (fields: {', '.join(docs[missing])})"
            )
    if id_field is None:
        if any(ID_FIELD in d for d in docs):
            raise UsageError(
                f"task {name}'s documents already have a field {ID_FIELD!r}; name the id field with --id-field"
            )
        docs = [{**d, ID_FIELD: f"{name}-{i:05d}"} for i, d in enumerate(docs)]
    ids = [str(d[id_field or ID_FIELD]) for d in docs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise UsageError(f"--id-field {id_field}: the value {dup!r} repeats in task {name}; ids must be unique")
    kept = {k: cfg[k] for k in KEEP if k in cfg and cfg[k] is not None}
    fewshot, shots = None, cfg.get("num_fewshot") or 0
    source = _source(task, cfg)
    if shots > 0:
        if any(CONTEXT_FIELD in d or SHOTS_FIELD in d for d in docs):
            raise UsageError(
                f"task {name}'s documents already have a field {CONTEXT_FIELD!r} or {SHOTS_FIELD!r}, which "
                "freeze writes the pinned few-shot prompt into; rename it in process_docs"
            )
        pinned = pin_shots(task, fewshot_seed)
        docs = [
            {**d, CONTEXT_FIELD: c, SHOTS_FIELD: ids}
            for d, c, ids in zip(docs, pinned.contexts, pinned.shot_ids, strict=True)
        ]
        fewshot = [_plain(d, f"task {name} few-shot example {i}") for i, d in enumerate(pinned.shots)]
        full_run = pinned.full_run
        # zero-shot over the pinned prefix: lm-eval renders golden_context + the item's question
        kept |= {"num_fewshot": 0, "description": CONTEXT_FIELD}
        fs = task.fewshot_cfg
        source["fewshot"] = {
            "num_fewshot": shots,
            "seed": fewshot_seed,
            "sampler": fs.sampler,
            "split": fs.split if fs.samples is None or fs.split else "samples (inline in the task YAML)",
            "pinned": f"{CONTEXT_FIELD} and {SHOTS_FIELD} in each item (quantize/golden/prompts.py)",
        }
    else:
        full_run = prompts(task)
    meta = {k: v for k, v in (cfg.get("metadata") or {}).items() if k != "config_source"}
    kept["metadata"] = meta | {"version": meta.get("version", 1.0)}
    return TaskFiles(
        name=name,
        output_type=kind,
        items=docs,
        config=kept,
        id_field=id_field or ID_FIELD,
        cluster_field=cluster_field,
        fewshot=fewshot,
        source=source,
    ), full_run


def _source(task: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Where the documents came from: the task (its version and YAML), the dataset, and local files' sha256."""
    from importlib import metadata

    src: dict[str, Any] = {
        "task": cfg.get("task"),
        "task_version": (cfg.get("metadata") or {}).get("version"),
        "lm_eval_version": metadata.version("lm_eval"),
        "dataset_path": cfg.get("dataset_path"),
        "dataset_name": cfg.get("dataset_name"),
        "split": task.config.test_split or task.config.validation_split,
    }
    kwargs = cfg.get("dataset_kwargs") or {}
    if kwargs.get("revision"):
        src["revision"] = kwargs["revision"]
    cached = getattr((getattr(task, "dataset", None) or {}).get(src["split"]), "cache_files", None) or []
    if cached and src["dataset_path"] not in LOCAL_BUILDERS:
        # datasets caches a hub dataset under the commit of the repository it read
        src["dataset_commit"] = Path(cached[0]["filename"]).parent.name
    files = kwargs.get("data_files")
    if isinstance(files, dict):
        src["data_files"] = {
            split: {"path": str(p), "sha256": _sha(Path(p))} for split, p in files.items() if isinstance(p, str)
        }
    yaml_path = (cfg.get("metadata") or {}).get("config_source")
    if yaml_path and Path(yaml_path).is_file():
        src["task_yaml"] = {"path": str(yaml_path), "sha256": _sha(Path(yaml_path))}
        # the Python the freeze ran (process_docs): the task folder's modules, by hash
        src["task_code"] = {p.name: _sha(p) for p in sorted(Path(yaml_path).parent.glob("*.py"))}
        # a YAML that includes another (lm-eval's own task, its dataset pointed at local files): that one too
        text = read_user_text(yaml_path, "task YAML", MAX_YAML_BYTES)
        found = re.search(r"^\s*\"?include\"?\s*:\s*\"?([^\"\n]+?)\"?\s*,?\s*$", text, re.M)
        included = Path(yaml_path).parent / found.group(1) if found else None
        if included is not None and included.is_file():
            src["task_yaml"]["include"] = {"path": str(included), "sha256": _sha(included)}
            src["task_code"] |= {p.name: _sha(p) for p in sorted(included.parent.glob("*.py"))}
    if callable(cfg.get("process_docs")):
        src["process_docs"] = getattr(cfg["process_docs"], "__qualname__", str(cfg["process_docs"]))
    src["python_version"] = platform.python_version()
    return src


def _sha(p: Path) -> str | None:
    return sha256_file(p) if p.is_file() else None


def freeze(
    names: list[str],
    out: Path,
    include_path: Path | None = None,
    id_field: str | None = None,
    cluster_field: str | None = None,
    seed: int = 0,
    fewshot_seed: int = LM_EVAL_FEWSHOT_SEED,
) -> Manifest:
    """Freeze lm-eval tasks into a new golden version folder, few-shot prompts pinned per item with lm-eval's own
    draws under `fewshot_seed` (its default, so each prompt is a default `lm_eval` run's). The written set is
    loaded through lm-eval and every item's prompt compared with the original task's before the folder is
    renamed into place. Returns the manifest."""
    out = Path(out)
    check_new_version(out)
    leaves = load_tasks(names, include_path)
    check_task_names(list(leaves))
    pairs = [freeze_task(leaves[t], id_field, cluster_field, fewshot_seed) for t in sorted(leaves)]
    frozen = [f for f, _ in pairs]
    originals = {f.name: run for f, run in pairs}
    command = ["quantize", "golden", "freeze", *[a for t in names for a in ("--task", t)], "--out", str(out)]
    if include_path:
        command += ["--include-path", str(include_path)]
    if id_field:
        command += ["--id-field", id_field]
    if cluster_field:
        command += ["--cluster-field", cluster_field]
    if fewshot_seed != LM_EVAL_FEWSHOT_SEED:
        command += ["--fewshot-seed", str(fewshot_seed)]
    id_fields = {f.name: f.id_field for f in frozen}
    return write_version(
        out,
        frozen,
        sources={t.name: t.source for t in frozen},
        builder={"command": shlex.join(command), "module": "quantize.golden.freeze"},
        note="Frozen from lm-eval tasks: the documents after the task's own filtering and process_docs.",
        seed=seed,
        check=lambda tmp: check_prompts(tmp, originals, id_fields),
    )
