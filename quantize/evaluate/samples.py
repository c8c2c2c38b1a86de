"""What any engine computed, from lm-eval's own samples: an lm-eval output folder written with `--log_samples`
(`results_DATE.json` and `samples_TASK_DATE.jsonl`, possibly one level down in the model-name folder lm-eval
makes) read as a ScoreDoc, so `quantize gate` judges what vLLM, SGLang or an OpenAI-compatible server computed on
a golden set exported by `quantize golden export` (quantize/golden/export.py).

Every file is read through the one reader (quantize/io.py: regular files only, capped, strict UTF-8, JSONL by
line): a FIFO, a device or an oversized file is exit 2, never a hang. Each sample is matched to its golden item
by the item's id (golden.item_key on the sample's `doc`); its `doc` must hold the golden item's fields, and its
`doc_hash`, `prompt_hash` and `target_hash` must be the hashes of what it records (lm-eval's own hashes:
sha256 of the doc as lm-eval dumps it, of the first request's context, of the target), and its requests (every
context, continuation and generation setting) the ones lm-eval builds for the item from the golden task YAMLs, as
the scorer loads them (`_golden_requests`). The samples must cover the
suite's tasks and items exactly (its smoke subset, where it takes one), at the golden tasks' versions, run with
the suite's seed. The per-item records and task figures are score.py's own (`item_records`, `task_scores`), over
the samples restored to the form lm-eval holds them in (its writer turns numbers and booleans of the responses
into strings, and each request's arguments into a mapping).

The provenance names what ran: lm-eval's model (`backend`: vllm, hf, local-completions, as recorded), its model
arguments as written, lm-eval's version from the results file, the device and dtype it recorded, and
`engine = "lm-eval samples (MODEL)"`; the checkpoint identity is the sha256 of one "NAME SHA256" line per file
read (the results file and each samples file), so two gates on the same files name one identity.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from quantize.compat.lm_eval import sandboxed_metrics, templates_refused
from quantize.errors import UsageError
from quantize.evaluate.cache import lm_eval_version
from quantize.evaluate.score import item_records, task_scores
from quantize.evaluate.suite import OpenSuite
from quantize.golden import items
from quantize.golden.manifest import item_id, lm_eval_tasks, read_items, task_config
from quantize.golden.prompts import requests
from quantize.io import decode_text, read_user_file, sha256_bytes, sha256_named, sha256_user_file, user_lines
from quantize.records import CheckpointRef, GoldenRef, ScoreDoc, ScoreProvenance, SuiteRef

MAX_RESULTS_BYTES = 64 * 2**20  # lm-eval's results file: configs and figures of every task, kilobytes to megabytes
MAX_SAMPLES_BYTES = 4 * 2**30  # one task's samples: every item's document, requests and responses
MAX_SAMPLE_LINE = 64 * 2**20  # one sample: a long document with its rolling windows, or many long choices
SEEDS = ("random_seed", "numpy_seed", "torch_seed", "fewshot_seed")  # lm-eval's, as its results file names them
HOW = (
    "run lm-eval on the tasks `quantize golden export SUITE OUT` writes, with the command it prints "
    "(--log_samples, --seed as printed)"
)
SHOWN = 5  # item ids named in a refusal


@dataclass(frozen=True)
class Run:
    """One lm-eval run in an output folder: its results file and its samples file per task."""

    folder: Path
    results: Path
    samples: dict[str, Path]


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _results_files(folder: Path) -> list[str]:
    return [e.name for e in _entries(folder) if e.name.startswith("results_") and e.name.endswith(".json")]


def _samples_files(folder: Path) -> list[str]:
    return [e.name for e in _entries(folder) if e.name.startswith("samples_") and e.name.endswith(".jsonl")]


def _run_folders(path: Path) -> list[Path]:
    """The folders holding an lm-eval run: `path` itself, or else the folders one level down (lm-eval's
    OUTPUT/MODEL_NAME/)."""
    if _results_files(path) or _samples_files(path):
        return [path]
    return [
        Path(e.path)
        for e in _entries(path)
        if e.is_dir(follow_symlinks=False) and (_results_files(Path(e.path)) or _samples_files(Path(e.path)))
    ]


def looks_like_samples(path: str | Path) -> bool:
    """Whether a gate side is lm-eval's output, not a checkpoint or a score file: a folder (no config.json) holding
    results_*.json or samples_*.jsonl, directly or one level down, or a results_*.json file beside samples files.
    Only names are looked at (nothing is opened: a FIFO among them is refused later, by the reader); `find_run`
    then says what is wrong with one (a run without --log_samples, several runs)."""
    p = Path(path)
    if p.name.startswith("results_") and p.suffix == ".json" and not p.is_dir():
        return bool(_samples_files(p.parent))
    if not p.is_dir() or (p / "config.json").exists():
        return False
    return bool(_run_folders(p))


def find_run(path: str | Path) -> Run:
    """The one lm-eval run `path` names (looks_like_samples): its folder, results file and samples per task. Several
    model folders, several runs in one folder, or a samples file of no run there is exit 2 saying which to pass."""
    p = Path(path)
    if p.name.startswith("results_") and p.suffix == ".json" and not p.is_dir():
        folder, results = p.parent, p.name
    else:
        folders = _run_folders(p)
        if len(folders) > 1:
            raise UsageError(
                f"{p} holds the lm-eval output of several models ({', '.join(f.name for f in folders[:SHOWN])}): "
                "pass the folder of the one to gate"
            )
        if not folders or not _results_files(folders[0]):
            raise UsageError(
                f"{p} holds no lm-eval results file (results_*.json); pass lm-eval's --output_path folder of a run "
                f"with --log_samples ({HOW})"
            )
        folder = folders[0]
        runs = _results_files(folder)
        if len(runs) > 1:
            raise UsageError(
                f"{folder} holds {len(runs)} lm-eval runs ({', '.join(runs[:SHOWN])}): pass the results file of "
                f"the run to gate (e.g. {folder / runs[-1]}), which takes that run's samples files"
            )
        results = runs[0]
    date = results.removeprefix("results_").removesuffix(".json")
    dates = [r.removeprefix("results_").removesuffix(".json") for r in _results_files(folder)]
    samples: dict[str, Path] = {}
    stray = []
    for name in _samples_files(folder):
        if name.endswith(f"_{date}.jsonl"):
            samples[name.removeprefix("samples_").removesuffix(f"_{date}.jsonl")] = folder / name
        elif not any(name.endswith(f"_{d}.jsonl") for d in dates):
            stray.append(name)
    if stray:
        raise UsageError(
            f"{folder} holds samples files of no results file there ({', '.join(stray[:SHOWN])}): they belong to "
            "another run, or lm-eval did not finish it; move them out of the folder, or run lm-eval again"
        )
    if not samples:
        raise UsageError(
            f"{folder / results} has no samples files (samples_TASK_{date}.jsonl): run lm-eval with --log_samples "
            f"({HOW})"
        )
    return Run(folder, folder / results, samples)


def read_samples(suite: OpenSuite, path: str | Path) -> ScoreDoc:
    """lm-eval's samples of one run (find_run) as a ScoreDoc of `suite` (module docstring); bad input is exit 2
    naming the file, the task and the items."""
    run = find_run(path)
    raw = read_user_file(run.results, "lm-eval results file", MAX_RESULTS_BYTES, hint=HOW)
    results = _json_object(decode_text(raw, f"lm-eval results file {run.results}"), run.results)
    files = {run.results.name: sha256_bytes(raw)}
    config = _field(results, "config", dict, run.results)
    _check_tasks(suite, run)
    _check_seeds(suite, config, run.results)
    _check_max_length(suite, config, run.results)
    versions = _field(results, "versions", dict, run.results)
    configs = _field(results, "configs", dict, run.results)
    for task in suite.tasks:
        _check_version(suite, task, versions, configs, run.results)
    built = _golden_requests(suite)
    ran = f"lm-eval {results.get('lm_eval_version')}"
    tasks = {}
    for task in suite.tasks:
        kind = suite.golden.entry(task).output_type
        samples, files[run.samples[task].name] = _task_samples(run.samples[task], kind)
        _check_items(suite, task, samples, run.samples[task], built[task], ran)
        items, filt = item_records(kind, samples, suite.golden.item_key(task))
        lm = results.get("results") if isinstance(results.get("results"), dict) else {}
        lm = lm.get(task, {})
        if not isinstance(lm, dict):
            raise UsageError(f"lm-eval results file {run.results}: its results of {task} are not an object; {HOW}")
        figures = {
            k: v for k, v in lm.items() if k != "alias" and isinstance(v, int | float) and not isinstance(v, bool)
        }
        try:
            tasks[task] = task_scores(kind, versions[task], items, figures, filt)
        except ValidationError as e:  # a figure no model computes: a log-likelihood above 0, a score of 0.5
            err = e.errors()[0]
            loc = list(err["loc"])  # (output type, "items", index, field) where an item's field is refused
            where = loc[loc.index("items") + 1] if "items" in loc[:-1] else None
            raise UsageError(
                f"lm-eval samples file {run.samples[task]}: {task}"
                + (f" item {items[where]['id']}" if isinstance(where, int) and where < len(items) else "")
                + f": {err['msg'].removeprefix('Value error, ')}; {HOW}"
            ) from None
    return _doc(suite, run, results, files, tasks)


def _doc(suite: OpenSuite, run: Run, results: dict[str, Any], files: dict[str, str], tasks: dict[str, Any]) -> ScoreDoc:
    config = results["config"]
    model = str(config.get("model"))
    args = config.get("model_args")
    model_args = args if isinstance(args, str) else json.dumps(args, sort_keys=True, default=str)
    identity = _identity(files)
    s = suite.suite
    when = results.get("date")
    try:  # lm-eval's run time; a value no clock holds (1e20, NaN) is not kept
        stamp = dt.datetime.fromtimestamp(when, dt.UTC) if isinstance(when, int | float) else dt.datetime.now(dt.UTC)
    except (OverflowError, ValueError, OSError):
        stamp = dt.datetime.now(dt.UTC)
    created = stamp.isoformat(timespec="seconds")
    try:
        wall = round(float(results.get("total_evaluation_time_seconds") or 0.0), 1)
    except (TypeError, ValueError):
        wall = 0.0
    wall = wall if math.isfinite(wall) and wall >= 0 else 0.0  # "inf" was printed as lm-eval's time
    return ScoreDoc(
        key=identity,
        provenance=ScoreProvenance(
            # no weights were read: the identity of what was gated is the samples' own bytes
            checkpoint=CheckpointRef(path=str(run.folder), weights_sha256=identity, identity_sha256=identity),
            # the suite the samples were checked against (its golden set, tasks, subset and seed); how the engine
            # ran is below: backend, device, dtype, engine and model_args as lm-eval recorded them
            suite=SuiteRef(path=suite.path, name=s.name, sha256=suite.sha256, settings=s.settings()),
            golden=GoldenRef(**suite.golden.provenance()),
            task_versions={t: tasks[t].version for t in tasks},
            lm_eval_version=str(results.get("lm_eval_version")),
            batch_size=_batch_size(config),
            seed=int(config["random_seed"]),
            backend=model,
            device=str(config.get("device") or "unknown"),
            dtype=_dtype(config),
            engine=f"lm-eval samples ({model})",
            samples=files,
            model_args=model_args,
        ),
        created=created,
        wall_seconds=wall,
        tasks=tasks,
    )


def _identity(files: dict[str, str]) -> str:
    """The identity of a run's samples: the sha256 of one "NAME SHA256" line per file read, in name order."""
    return sha256_named(sorted(files.items()))


def run_identity(path: str | Path) -> str:
    """The identity `read_samples` gives the run `path` names, from its files' bytes alone (a policy's pinned
    baseline is checked against it before anything is read as scores)."""
    run = find_run(path)
    paths = [(run.results, "lm-eval results file", MAX_RESULTS_BYTES)]
    paths += [(p, "lm-eval samples file", MAX_SAMPLES_BYTES) for p in run.samples.values()]
    return _identity({p.name: sha256_user_file(p, what, cap, hint=HOW) for p, what, cap in paths})


def _batch_size(config: dict[str, Any]) -> int:
    """lm-eval's batch size as recorded: a number, or with `auto` the first size it found (0: none recorded)."""
    for v in (config.get("batch_size"), *(config.get("batch_sizes") or [])):
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, str) and v.isdigit():
            return int(v)
    return 0


def _model_arg(config: dict[str, Any], name: str) -> str | None:
    """One of lm-eval's model arguments as it recorded them (a dict, or the `k=v,k=v` string of --model_args)."""
    args = config.get("model_args")
    pairs = args.items() if isinstance(args, dict) else (a.partition("=")[::2] for a in str(args or "").split(","))
    return next((str(v).strip() for k, v in pairs if str(k).strip() == name), None)


def _check_max_length(suite: OpenSuite, config: dict[str, Any], where: Path) -> None:
    """Where the suite sets max_length, the run's context window is it: lm-eval's `max_length` model argument equal
    to it. A run at the full length was paired with a suite of max_length 32 (rolling documents cut differently
    on the two sides: the same model REJECTED). A suite that takes the model's own window takes the run's (an API
    model states its window as max_length; a local one may not state it at all)."""
    want, got = suite.suite.max_length, _model_arg(config, "max_length")
    if want is None or got == str(want):
        return
    said = "no max_length (the model's own window)" if got is None else f"max_length={got}"
    raise UsageError(
        f"{where}: lm-eval ran with {said}, and suite {suite.path} scores with max_length={want}: their "
        f"log-likelihoods are of other windows. Run lm-eval with the command `quantize golden export` prints for "
        f"the suite ({HOW})"
    )


def _dtype(config: dict[str, Any]) -> str:
    """The dtype lm-eval recorded for the model (`model_dtype`), else the `dtype=` of its model arguments."""
    if isinstance(found := config.get("model_dtype"), str) and found:
        return found.removeprefix("torch.")
    return _model_arg(config, "dtype") or "unknown"


def _json_object(text: str, where: Path) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"lm-eval results file {where} is not JSON ({str(e)[:200]}); {HOW}") from None
    if not isinstance(data, dict):
        raise UsageError(f"lm-eval results file {where} is not a JSON object; {HOW}")
    return data


def _field(data: dict[str, Any], name: str, kind: type, where: Path) -> Any:
    if not isinstance(data.get(name), kind):
        raise UsageError(
            f"lm-eval results file {where} has no `{name}` {kind.__name__} (not a file lm-eval wrote?); {HOW}"
        )
    return data[name]


def _check_tasks(suite: OpenSuite, run: Run) -> None:
    missing = sorted(set(suite.tasks) - set(run.samples))
    extra = sorted(set(run.samples) - set(suite.tasks))
    if missing or extra:
        said = "; ".join(
            s
            for s in (
                f"no samples of {', '.join(missing)}" if missing else "",
                f"samples of {', '.join(extra)}, which the suite does not score" if extra else "",
            )
            if s
        )
        raise UsageError(
            f"{run.results}: the run does not cover the tasks of suite {suite.path} ({said}); it scores "
            f"{', '.join(suite.tasks)}: run lm-eval with --tasks {','.join(suite.tasks)} ({HOW})"
        )


def _check_seeds(suite: OpenSuite, config: dict[str, Any], where: Path) -> None:
    seed = suite.suite.seed
    # a whole number, as lm-eval records one: `False` or `0.0` compared equal to a seed of 0
    other = {k: v for k in SEEDS if type(v := config.get(k)) is not int or v != seed}
    if other:
        shown = ", ".join(f"{k} {v}" for k, v in other.items())
        raise UsageError(
            f"{where}: lm-eval ran with other seeds than suite {suite.path} scores with ({shown}; the suite's seed is "
            f"{seed} for every one): run lm-eval again with --seed {seed}"
        )


# what makes a task's requests and their scoring: compared between the run's recorded config and the golden task
REQUEST_KEYS = (
    "doc_to_text",
    "doc_to_target",
    "doc_to_choice",
    "description",
    "target_delimiter",
    "fewshot_delimiter",
    "num_fewshot",
    "gen_prefix",
    "generation_kwargs",
    "filter_list",
    "metric_list",
)


def _check_version(suite: OpenSuite, task: str, versions: dict[str, Any], configs: dict[str, Any], where: Path) -> None:
    """The task lm-eval ran is the golden task: the same version (metadata.version) and output type, and each of
    its templates, delimiters, few-shot count, generation settings, filters and metrics the golden YAML sets
    (REQUEST_KEYS) as the run's config records it. A run on edited task YAMLs (targets upper-cased) recorded the
    same version and passed: the first context alone was compared, not the continuations it scored. A key the
    golden YAML leaves to lm-eval's default is not compared (lm-eval records its defaults in forms of its own)."""
    golden = _golden_task(suite, task)
    ours = (golden.get("metadata") or {}).get("version")
    ran = configs.get(task) if isinstance(configs.get(task), dict) else {}
    if versions.get(task) != ours or ran.get("output_type") != golden.get("output_type"):
        raise UsageError(
            f"{where}: task {task} ran at version {versions.get(task)!r} ({ran.get('output_type')}), and golden set "
            f"{suite.golden.path} has it at version {ours!r} ({golden.get('output_type')}): the samples are of another "
            f"task than the suite scores; {HOW}"
        )
    differ = [k for k in REQUEST_KEYS if k in golden and ran.get(k) != golden[k]]
    if differ:
        raise UsageError(
            f"{where}: task {task} ran with another {', '.join(differ)} than golden set {suite.golden.path}'s task "
            f"YAML: its requests or scoring are not the suite's (task YAMLs edited, or of another export); {HOW}"
        )


def _golden_task(suite: OpenSuite, task: str) -> dict[str, Any]:
    for name in suite.golden.manifest.files:
        if name.startswith("tasks/"):
            cfg = task_config(suite.golden.path, name)
            if isinstance(cfg, dict) and cfg.get("task") == task:
                return cfg
    raise UsageError(f"golden set {suite.golden.path} has no task YAML of {task}")  # a verified set always has one


def _task_samples(path: Path, kind: str) -> tuple[list[dict[str, Any]], str]:
    """A samples file's samples, restored to lm-eval's in-memory form, and the file's sha256 (of the bytes read)."""
    out = []
    with user_lines(path, "lm-eval samples file", MAX_SAMPLES_BYTES, MAX_SAMPLE_LINE, hint=HOW) as lines:
        for n, raw in lines:
            try:
                s = json.loads(lines.text(n, raw))
                out.append(_restored(s, kind))
            except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
                raise UsageError(
                    f"lm-eval samples file {path} line {n} is not a sample lm-eval writes for a {kind} task "
                    f"({type(e).__name__}: {str(e)[:120]}); {HOW}"
                ) from None
        digest = lines.hexdigest()
    return out, digest


def _restored(s: dict[str, Any], kind: str) -> dict[str, Any]:
    """One written sample as lm-eval held it when scoring (what score.item_records reads): the arguments of each
    request as a tuple, the log-likelihood responses as numbers and booleans; the hashes checked against what the
    sample records (`_consistent`)."""
    args = s["arguments"]
    if isinstance(args, dict):  # lm-eval's writer: {"gen_args_0": {"arg_0": context, "arg_1": ...}, ...}
        args = [tuple(a[f"arg_{j}"] for j in range(len(a))) for a in (args[f"gen_args_{i}"] for i in range(len(args)))]
    resps = s["filtered_resps"]
    if kind in ("multiple_choice", "loglikelihood"):
        resps = [(float(ll), _boolean(greedy)) for ll, greedy in resps]
    elif kind == "loglikelihood_rolling":
        resps = [float(r[0] if isinstance(r, list) else r) for r in resps]
    restored = {**s, "arguments": args, "filtered_resps": resps}
    fields = ("doc_id", "doc", "filter", "target", "doc_hash", "prompt_hash", "target_hash")
    if lacking := [f for f in fields if f not in s]:
        raise KeyError(lacking[0])  # a sample without one is not lm-eval's: named by the caller
    if not isinstance(s["doc"], dict):
        raise TypeError("its doc is not an object")
    if isinstance(s["doc_id"], bool) or not isinstance(s["doc_id"], int):  # lm-eval numbers its documents
        raise TypeError(f"its doc_id {str(s['doc_id'])[:40]!r} is not a whole number")
    if not isinstance(args, list) or not args or not all(isinstance(a, tuple) and a for a in args):
        raise TypeError("its arguments are not lm-eval's requests")
    if not isinstance(resps, list) or len(resps) != len(args):
        raise TypeError("its filtered_resps are not one response per request")
    return restored


def _boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if v in ("True", "False"):
        return v == "True"
    raise ValueError(f"is_greedy {str(v)[:20]!r} is not True or False")


def _consistent(s: dict[str, Any]) -> bool:
    """The sample's hashes are those of what it records (lm-eval's hash_string over its doc, its first request's
    context and its target)."""
    doc = json.dumps(s["doc"], indent=2, ensure_ascii=False)
    return (
        s["doc_hash"] == sha256_bytes(doc.encode())
        and s["prompt_hash"] == sha256_bytes(str(s["arguments"][0][0]).encode())
        and s["target_hash"] == sha256_bytes(str(s["target"]).encode())
    )


def _golden_requests(suite: OpenSuite) -> dict[str, dict[str, list[Any]]]:
    """Every item's requests as lm-eval builds them from the golden set's task YAMLs, loaded as the scorer loads
    them (manifest.lm_eval_tasks: the verified YAMLs, the suite's smoke subset where it takes one; templates
    sandboxed; the few-shot sampler seeded with the suite's seed, as simple_evaluate seeds it), by task and item
    id, in the JSON form a samples file records them. The first context's hash alone was compared (prompt_hash):
    a run on task YAMLs that set a target_delimiter, generation settings or a description the golden YAML leaves
    to lm-eval's defaults scored other continuations or generations under the same version."""
    from lm_eval.tasks import TaskManager, get_task_dict

    golden = suite.golden
    ids = golden.manifest.smoke_ids if suite.suite.subset == "smoke" else None
    out: dict[str, dict[str, list[Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="quantize-requests-") as tmp:
        include = lm_eval_tasks(golden, Path(tmp), ids, sandboxed_metrics())
        with templates_refused(f"golden set {golden.path}"):
            loaded = get_task_dict(list(suite.tasks), TaskManager(include_path=str(include), include_defaults=False))
            for task in suite.tasks:
                t = loaded[task]
                t.set_fewshot_seed(suite.suite.seed)
                docs, key = list(t.eval_docs), golden.item_key(task)
                out[task] = {item_id(docs[d], key)[0]: _recorded(reqs) for d, reqs in requests(t).items()}
    return out


def _recorded(value: Any) -> Any:
    """A request's arguments as lm-eval's samples file records them (its writer's JSON: tuples as lists, numpy
    numbers as numbers, sets as lists, anything else as its string)."""
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(value, default=handle_non_serializable, ensure_ascii=False))


def _request_problem(s: dict[str, Any], built: list[Any] | None, ran: str) -> str | None:
    """What is wrong with a sample's hashes or requests: hashes other than those of what it records, or (`built`:
    the item's requests from _golden_requests; None: not compared) requests lm-eval does not build for the item."""
    if not _consistent(s):
        return "doc_hash, prompt_hash or target_hash not the hash of what the sample records"
    if built is not None and _recorded(s["arguments"]) != built:
        return (
            f"requests (contexts, continuations or generation settings) other than lm-eval {lm_eval_version()} "
            f"builds from the golden task YAML (the run: {ran}; task YAMLs edited, a chat template applied, or "
            "another lm-eval's defaults)"
        )
    return None


def _check_items(
    suite: OpenSuite,
    task: str,
    samples: list[dict[str, Any]],
    path: Path,
    built: dict[str, list[Any]],
    ran: str,
) -> None:
    """Each sample is a golden item of the suite (its doc holds the item's fields) with consistent hashes and the
    requests `built` gives the item (_golden_requests), and every item the suite scores has one: else exit 2
    naming the items. `ran`: the lm-eval the run recorded, named where the requests differ."""
    key = suite.golden.item_key(task)
    wanted = suite_items(suite, task)
    seen: dict[str, Any] = {}
    documents: set[Any] = set()
    filters: dict[str, set[str]] = {}
    problems: dict[str, list[str]] = {}
    rules = _choice_rules(suite, task)
    matches = _exact_match(suite, task)

    def bad(what: str, i: str) -> None:
        problems.setdefault(what, []).append(i)

    for s in samples:
        try:
            i, _ = item_id(s["doc"], key)
        except KeyError:
            bad(f"no `{key[0]}` field in the doc (doc_id)", str(s["doc_id"]))
            continue
        if seen.setdefault(i, s["doc_id"]) != s["doc_id"]:
            bad("two documents with one id", i)
        if (str(s["doc_id"]), str(s["filter"])) in documents:  # lm-eval writes one a filter pipeline (gsm8k: two)
            bad("two samples of one document (doc_id) and filter", i)
        documents.add((str(s["doc_id"]), str(s["filter"])))
        filters.setdefault(i, set()).add(str(s["filter"]))
        if i not in wanted:
            bad("not an item of the suite", i)
        elif not _holds(s["doc"], wanted[i]):
            bad("a doc that differs from the golden item", i)
        elif why := (
            _choice_problem(s, items.gold(rules, wanted[i]), items.choices(rules, wanted[i]))
            if rules is not None
            else matches(s)
            if matches is not None
            else None
        ):
            bad(why, i)
        if why := _request_problem(s, built.get(i, []) if i in wanted else None, ran):
            bad(why, i)
    every = set().union(*filters.values()) if filters else set()
    for i, found in filters.items():  # one sample a filter pipeline for every document, as lm-eval writes them
        if found != every:
            bad(f"not one sample for each filter ({', '.join(sorted(every))})", i)
    if missing := [i for i in wanted if i not in seen]:
        problems["missing (no sample)"] = missing
    if problems:
        said = "; ".join(
            f"{what}: {len(ids)} item(s), e.g. {', '.join(sorted(set(ids))[:SHOWN])}" for what, ids in problems.items()
        )
        raise UsageError(
            f"{path}: the samples of {task} are not the golden items suite {suite.path} scores ({said}). Gate samples "
            f"of an unchanged, complete run ({HOW}; no --limit)"
        )


def _exact_match(suite: OpenSuite, task: str) -> Any:
    """For a generation task whose golden YAML scores exact_match: a check of one sample's `exact_match` against
    lm-eval's own metric on its response and target, with the task's options (ignore_case, regexes_to_ignore, ...):
    the gate read it as written, and a run whose every response was set to "WRONG" and every exact_match to 1
    passed (a review's repro). None for other tasks. The check returns why a sample fails it, or None."""
    if suite.golden.entry(task).output_type != "generate_until":
        return None
    listed = _golden_task(suite, task).get("metric_list") or []
    entry = next((m for m in listed if isinstance(m, dict) and m.get("metric") == "exact_match"), None)
    if entry is None:
        return None
    from lm_eval.api.registry import get_metric

    metric = get_metric("exact_match")
    options = {k: v for k, v in entry.items() if k not in ("metric", "aggregation", "higher_is_better")}

    def check(s: dict[str, Any]) -> str | None:
        resps, target = s["filtered_resps"], s["target"]
        said = s.get("exact_match")
        if said is None or not isinstance(target, str) or not resps or not isinstance(resps[0], str):
            return None  # another filter's shape, or a list of targets: not recomputed here
        if isinstance(said, bool) or not isinstance(said, int | float) or said not in (0, 1):
            return "an `exact_match` that is not 0 or 1"
        if float(metric(references=[target], predictions=[resps[0]], **options)["exact_match"]) != float(said):
            return "an `exact_match` its response and target do not give"
        return None

    return check


def _choice_rules(suite: OpenSuite, task: str) -> items.TaskRules | None:
    """A multiple-choice task's doc_to_target and doc_to_choice (what gives an item's right choice), else None."""
    if suite.golden.entry(task).output_type != "multiple_choice":
        return None
    cfg = _golden_task(suite, task)
    target, choice = cfg.get("doc_to_target"), cfg.get("doc_to_choice")
    rules = items.TaskRules(task, *suite.golden.item_key(task), None, target, choice)
    return None if items.compile_templates(rules) else rules


def _choice_problem(s: dict[str, Any], gold: int | None, choices: list[str] | None = None) -> str | None:
    """What a multiple-choice sample records that the golden item and its own log-likelihoods contradict: its target
    another index than the item's right choice, an `acc` or `acc_norm` that is not 0 or 1, or an `acc` (`acc_norm`)
    other than what its log-likelihoods give (lm-eval's: 1 where the highest log-likelihood, per character of the
    choice for acc_norm, is the right choice's). The gate
    reads `acc` as written, so an edited one was a verdict (a review: every item set right passed a candidate with
    the baseline's log-likelihoods; a target set to the highest one's index did too)."""
    if gold is None or str(s["target"]) != str(gold):
        return "a target other than the golden item's right choice"
    lls = [float(r[0]) for r in s["filtered_resps"]]
    if not 0 <= gold < len(lls):
        return "a target past its choices"
    for metric in ("acc", "acc_norm"):
        value = s.get(metric, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value not in (0, 1):
            return f"an `{metric}` that is not 0 or 1"
    if "acc" in s and all(math.isfinite(x) for x in lls) and s["acc"] != float(lls.index(max(lls)) == gold):
        return "an `acc` its log-likelihoods do not give"
    if "acc_norm" in s and choices is not None and len(choices) == len(lls) and all(math.isfinite(x) for x in lls):
        # lm-eval's: the highest log-likelihood per character of the choice (doc_to_choice's strings) is the right one
        norm = [x / max(len(c), 1) for x, c in zip(lls, choices, strict=True)]
        if s["acc_norm"] != float(norm.index(max(norm)) == gold):
            return "an `acc_norm` its log-likelihoods do not give"
    return None


def _holds(doc: Any, item: Any) -> bool:
    """Whether lm-eval's document holds the golden item: its values, where the json loader of `datasets` may have
    added keys (an object's keys are the union over every row, None where a row has none)."""
    if isinstance(item, dict):
        return (
            isinstance(doc, dict)
            and all(_holds(doc.get(k), v) for k, v in item.items())
            and all(doc[k] is None for k in doc.keys() - item.keys())
        )
    if isinstance(item, list):
        return isinstance(doc, list) and len(doc) == len(item) and all(map(_holds, doc, item))
    return doc == item


def suite_items(suite: OpenSuite, task: str) -> dict[str, dict[str, Any]]:
    """The golden items the suite scores on `task` (its smoke subset, where it takes one), by id."""
    ids = suite.golden.manifest.smoke_ids.get(task) if suite.suite.subset == "smoke" else None
    key = suite.golden.item_key(task)
    items = {item_id(d, key)[0]: d for d in read_items(suite.golden, task)}
    return items if ids is None else {i: items[i] for i in ids if i in items}
