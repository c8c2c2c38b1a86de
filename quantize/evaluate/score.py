"""Score a checkpoint on a golden set with lm-eval, keep per-item records, cache by provenance.

The cache key (quantize/evaluate/cache.py) is (checkpoint identity: weights, config, tokenizer; suite settings hash,
golden manifest sha256, lm-eval version, tasks, runtime, the scorer: cache.scorer_id): scoring the same baseline
twice costs nothing the second time.

Per-item records (for paired comparison in the gate), one kind per lm-eval output type: quantize/kinds.py.
"""

from __future__ import annotations

import datetime as dt
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import TypeAdapter

from quantize import progress
from quantize.cache import claimed
from quantize.checkpoint import finite, qdq
from quantize.checkpoint.files import (
    check_identity,
    check_loadable,
    check_model_dir,
    identity_sha256,
    loadable_view,
    weights_sha256,
)
from quantize.checkpoint.loader import LastModel, usable_device
from quantize.checkpoint.loader import device as pick_device
from quantize.checkpoint.rounding import stored_rounds_activations
from quantize.compat import lm_eval as lm_eval_compat
from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate import cache
from quantize.evaluate.engine import Recorded, ScoredTokens, gguf_to_score, llamacpp_settings
from quantize.evaluate.suite import Backend, OpenSuite, Suite
from quantize.golden.manifest import GoldenSet, lm_eval_tasks
from quantize.golden.manifest import item_id as golden_item_id
from quantize.golden.templates import check_templates
from quantize.kinds import KINDS, item_metrics
from quantize.records import (
    CheckpointRef,
    GoldenRef,
    ScoreDoc,
    ScoreProvenance,
    SuiteRef,
    TaskScores,
)
from quantize.tables import counted

# identities this process scored in full (not read from the cache), in order: a sweep task reports them, so a
# sweep can show that its baseline was scored once
SCORED_HERE: list[str] = []


class Scored(NamedTuple):
    doc: ScoreDoc
    cached: bool


def model_args(suite: Suite, ckpt: Path, device: str, trust_remote_code: bool = False) -> dict[str, Any]:
    """lm-eval's model arguments, as the dict `simple_evaluate` takes (a path may hold ',' or '=')."""
    args: dict[str, Any] = {
        "pretrained": str(ckpt),
        "dtype": suite.model_dtype(device),
        "trust_remote_code": trust_remote_code,
    }
    if suite.max_length:
        args["max_length"] = suite.max_length
    if suite.backend is Backend.vllm and suite.vllm:
        args.update(suite.vllm.model_dump())
    return args


def vllm_lm(suite: Suite, ckpt: Path, device: str, models: LastModel) -> Any:
    """lm-eval's vLLM model of the checkpoint (vLLM loads by path), built once and kept by `models`: every
    stage of a gate and its agreement pass use the same engine."""
    args = model_args(suite, ckpt, device, models.trust_remote_code)

    def build() -> Any:
        from lm_eval.models.vllm_causallms import VLLM

        with loadable_view(ckpt) as src:  # vLLM reads every file while the engine starts
            # vLLM returns at most max_logprobs per position: the agreement's top-k must fit
            kwargs = {**args, "pretrained": str(src)}
            return VLLM(**kwargs, batch_size=suite.batch_size, max_logprobs=max(20, suite.agreement.top_k))

    return models.engine(ckpt, "vllm", repr(sorted(args.items())), build)


def llamacpp_lm(suite: Suite, gguf: Path, models: LastModel) -> Any:
    """Our llama.cpp model of a GGUF (quantize/evaluate/llamacpp.py), built once and kept by `models`: every stage
    of a gate and its agreement pass use the same engine."""
    s = llamacpp_settings(suite)
    args = {"pretrained": str(gguf), "n_threads": s.n_threads, "n_batch": s.n_batch, "max_length": suite.max_length}

    def build() -> Any:
        from quantize.evaluate.llamacpp import LlamaCppLM

        return LlamaCppLM(**args, seed=suite.seed)

    return models.engine(gguf, "llamacpp", repr(sorted(args.items())), build)


def check_scorable(suite: OpenSuite, ckpt: Path) -> Path | None:
    """Before anything loads: a GGUF that llama.cpp can score (returned), or a checkpoint folder transformers can
    load with the packages installed here (None); a UsageError for anything else (evaluate/engine.gguf_to_score)."""
    if (gguf := gguf_to_score(ckpt, suite.suite)) is None:
        check_model_dir(ckpt)
        check_loadable(ckpt)
    return gguf


def lm_eval_model(suite: Suite, ckpt: Path, device: str, models: LastModel) -> dict[str, Any]:
    """What `simple_evaluate` scores. A GGUF: our llama.cpp model (`llamacpp_lm`). `backend: quantize` (the
    default): our lm-eval model, quantize/evaluate/lm.py (each distinct context computed once, an item's numbers
    independent of its batch); `backend: hf`: lm-eval's stock HFLM. Both get a model our loader loaded
    (safetensors only, strict: lm-eval's own loader would start missing weights from random values); vLLM loads by
    path, once per checkpoint (`vllm_lm`)."""
    if (gguf := gguf_to_score(ckpt, suite)) is not None:
        return {"model": llamacpp_lm(suite, gguf, models)}
    if suite.backend is Backend.vllm:
        return {"model": vllm_lm(suite, ckpt, device, models)}
    model, tok = models.get(ckpt, dtype=suite.model_dtype(device), on=device)
    args = {"pretrained": model, "tokenizer": tok, "batch_size": suite.batch_size, "max_length": suite.max_length}
    if suite.backend is Backend.hf:
        from lm_eval.models.huggingface import HFLM

        return {"model": HFLM(**args)}
    from quantize.evaluate.lm import PrefixLM

    return {"model": PrefixLM(**args)}


def item_records(
    output_type: str,
    samples: list[dict[str, Any]],
    key: tuple[str, str | None],
    tokens: dict[int, Recorded] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Per-item records from lm-eval's samples (the kind's fields, quantize/kinds.py), and the filter the score
    was matched after where lm-eval writes one sample per filter pipeline (the task's first); every pipeline's
    per-item metrics are kept in `metrics`, lm-eval's hash of the prompt in `prompt_sha256`, and what the engine
    recorded (`tokens`: per document, engine.ScoredTokens; None: a backend that records none): the hash of the
    tokens it scored in `tokens_sha256`, and a generated item's log-likelihood of its generated tokens in
    `generated_ll` (non-finite where its logits were). `key`: the item fields holding the stable id and the
    cluster (golden.item_key)."""
    kind = KINDS[output_type]
    filt = None
    by_doc: dict[int, list[dict[str, Any]]] = {}
    for s in samples:
        by_doc.setdefault(s["doc_id"], []).append(s)
    if kind.one_filter:
        filt = samples[0]["filter"] if samples else None
    out = []
    for doc in sorted(by_doc):
        group = by_doc[doc]
        s = next(x for x in group if x["filter"] == filt) if filt is not None else group[0]
        item_id, cluster = golden_item_id(s["doc"], key)
        rec = tokens.get(doc) if tokens is not None else None
        if tokens is not None and rec is None:
            raise RuntimeFailure(f"document {doc} ({item_id}) was scored with no tokens recorded: a bug of ours")
        extra: dict[str, Any] = {
            "metrics": item_metrics(group, kind.metrics),
            "prompt_sha256": s.get("prompt_hash"),
            "tokens_sha256": rec.tokens_sha256 if rec is not None else None,
        }
        if rec is not None and rec.generated_ll is not None:
            extra["generated_ll"] = rec.generated_ll
        out.append({"id": item_id, "cluster": cluster, **kind.item(s), **extra})
    return out, filt


def task_scores(
    output_type: str,
    version: float | str,
    items: list[dict[str, Any]],
    results: dict[str, float],
    filt: str | None = None,
) -> TaskScores:
    """Task-level figures from the items (so cached and fresh results agree) and lm-eval's own."""
    summary = KINDS[output_type].summary(items, filt)
    base = {"output_type": output_type, "version": version, "n": len(items)}
    return TypeAdapter(TaskScores).validate_python({**base, **summary, "lm_eval": results, "items": items})


def score(
    suite: OpenSuite,
    checkpoint: str | Path,
    refresh: bool = False,
    trust_remote_code: bool = False,
    models: LastModel | None = None,
    use_cache: bool = True,
    before_store: Callable[[], None] | None = None,
) -> Scored:
    """Score a checkpoint on an open suite; the result comes from the cache when it is there. `models`
    lets a caller that needs the same checkpoint again (agreement) keep it loaded. `use_cache=False`: scored here,
    the cache neither read nor written (a gate's candidate: the caller stores it once its identity is checked).
    `before_store` is called before scores computed here are cached under the identity, and may raise (its Hub
    blob names checked: api.scored)."""
    models = models or LastModel(trust_remote_code)
    ckpt = Path(checkpoint)
    check_scorable(suite, ckpt)
    ref = checkpoint_ref(ckpt)
    if not use_cache:
        doc = run_lm_eval(suite, ckpt, ref, models)
        SCORED_HERE.append(ref.identity_sha256)
        return Scored(doc, False)
    run = runtime(suite, models.trust_remote_code, ckpt)
    if not refresh and (found := cache.lookup_scores(suite, ref.identity_sha256, run)) is not None:
        progress.note("read from the cache")
        return Scored(with_ref(found, ref), True)
    with claimed(cache.score_path(suite, ref.identity_sha256, run)):
        # another process may have scored it while this one waited for the claim
        if not refresh and (found := cache.lookup_scores(suite, ref.identity_sha256, run)) is not None:
            return Scored(with_ref(found, ref), True)
        doc = run_lm_eval(suite, ckpt, ref, models)
        if before_store is not None:
            before_store()
        cache.store_scores(suite, doc)
    SCORED_HERE.append(ref.identity_sha256)
    return Scored(doc, False)


def checkpoint_ref(ckpt: Path) -> CheckpointRef:
    """What a score file records of the checkpoint scored: its path, weights hash and identity, and its tensors
    storing NaN or infinity (finite.non_finite_tensors, a GGUF's or safetensors files': the scores may be finite
    where the weights are not, as an embedding row no item reads)."""
    return CheckpointRef(
        path=str(ckpt),
        weights_sha256=weights_sha256(ckpt),
        identity_sha256=identity_sha256(ckpt),
        non_finite_tensors=finite.non_finite_tensors(ckpt) or None,
    )


def with_ref(doc: ScoreDoc, ref: CheckpointRef) -> ScoreDoc:
    """Cached scores of the checkpoint `ref` names, carrying its non-finite tensors as scanned here (an entry
    written before they were recorded, of the same identity, holds none)."""
    if doc.provenance.checkpoint.non_finite_tensors == ref.non_finite_tensors:
        return doc
    checkpoint = doc.provenance.checkpoint.model_copy(update={"non_finite_tensors": ref.non_finite_tensors})
    return doc.model_copy(update={"provenance": doc.provenance.model_copy(update={"checkpoint": checkpoint})})


def runtime(suite: OpenSuite, trust_remote_code: bool, checkpoint: Path, device: str | None = None) -> cache.Runtime:
    """The runtime this process scores `checkpoint` under (on `device`, else the suite's device resolved here;
    llama.cpp's for a GGUF): what keys its cache entries. A checkpoint whose config.json rounds activations names
    this machine on a CPU (cache.Runtime.rounding)."""
    if gguf_to_score(checkpoint) is not None:
        return cache.llamacpp_runtime(suite)
    on = device or pick_device(suite.suite.device)
    return cache.Runtime.on(suite, on, trust_remote_code, stored_rounds_activations(checkpoint))


def check_threads(ckpt: Path, run: cache.Runtime) -> None:
    """A runtime that names a thread count (an activation-rounding model on a CPU) is the count torch computed
    with (scores, a baseline's top-k, an agreement): the load pins it (checkpoint/loader.LastModel), and a count
    changed since would put these numbers under another count's key. Our failure (exit 3) where they differ."""
    if run.threads is None:
        return
    import torch

    if (used := torch.get_num_threads()) != run.threads:
        raise RuntimeFailure(
            f"{ckpt} was computed with torch at {counted(used, 'thread')}, but its cache key names {run.threads} "
            "(quantize/machine.py): nothing was cached; a bug of ours, or something in this process set torch's "
            "thread count while it computed"
        )


def reported(run: Callable[..., ScoreDoc]) -> Callable[..., ScoreDoc]:
    """run_lm_eval as a progress stage (quantize/progress.py): which checkpoint, which tasks (and how many items of
    each, where only some are asked for); its end line counts the items scored."""

    @functools.wraps(run)
    def stage(
        suite: OpenSuite, ckpt: Path, ref: CheckpointRef, models: LastModel, samples: dict[str, list[int]] | None = None
    ) -> ScoreDoc:
        tasks = [t for t in suite.tasks if samples is None or samples.get(t)]
        what = ", ".join(f"{len(samples[t])} items of {t}" if samples is not None else t for t in tasks)
        total = sum(len(samples[t]) for t in tasks) if samples is not None else None
        with progress.stage(f"scoring {ckpt.name} with lm-eval: {what}", total) as st:
            doc = run(suite, ckpt, ref, models, samples)
            st.done = sum(t.n for t in doc.tasks.values())
        return doc

    return stage


def evaluate_suite(suite: OpenSuite, model: dict[str, Any], tasks: list[str], **kwargs: Any) -> dict[str, Any]:
    """lm-eval's `simple_evaluate` of `model` (its keyword arguments) on the suite's golden tasks `tasks`, written
    into a temporary include folder (the manifest's smoke ids where the suite takes its smoke subset), seeded with
    the suite's seed, every sample logged; `kwargs`: more of simple_evaluate's arguments (samples, batch_size,
    device)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    s, golden = suite.suite, suite.golden
    with tempfile.TemporaryDirectory(prefix="quantize-tasks-") as tmp:
        ids = golden.manifest.smoke_ids if s.subset == "smoke" else None
        include = lm_eval_tasks(golden, Path(tmp), ids, lm_eval_compat.sandboxed_metrics())
        with lm_eval_compat.templates_refused(f"golden set {golden.path}"), lm_eval_compat.quiet_git():
            return simple_evaluate(
                **model,
                tasks=tasks,
                task_manager=TaskManager(include_path=str(include), include_defaults=False),
                log_samples=True,
                random_seed=s.seed,
                numpy_random_seed=s.seed,
                torch_random_seed=s.seed,
                fewshot_random_seed=s.seed,
                # our own statistics come from the per-item records; lm-eval's bootstrap stderr forks a
                # multiprocessing pool inside a threaded torch process, which can deadlock
                bootstrap_iters=0,
                **kwargs,
            )


TEMPLATES_CHECKED: set[tuple[str, tuple[str, ...]]] = set()  # (manifest sha256, tasks) checked in this process


def templates_checked(golden: GoldenSet, tasks: list[str]) -> None:
    """golden/templates.check_templates, once per set and tasks in a process (a gate scores a set many times)."""
    key = (golden.manifest_sha256, tuple(tasks))
    if key not in TEMPLATES_CHECKED:
        check_templates(golden, tasks)
        TEMPLATES_CHECKED.add(key)


@reported
def run_lm_eval(
    suite: OpenSuite, ckpt: Path, ref: CheckpointRef, models: LastModel, samples: dict[str, list[int]] | None = None
) -> ScoreDoc:
    """lm-eval on the suite's golden tasks with per-item samples, turned into a ScoreDoc. `samples`: only these
    documents (indices in the task's document order) of these tasks, lm-eval's `samples=`."""
    s, golden = suite.suite, suite.golden
    tasks = [t for t in suite.tasks if samples is None or samples.get(t)]
    gguf = gguf_to_score(ckpt, s)
    device = "cpu" if gguf is not None else usable_device(s.device, f"suite {suite.path}: `device:`")
    run = runtime(suite, models.trust_remote_code, ckpt, device)
    t0 = time.perf_counter()
    templates_checked(golden, tasks)  # a template lm-eval cannot render is exit 2 naming it, before the load
    # loaded before lm-eval runs: a checkpoint that does not load strictly is the user's to fix (exit 2)
    model = lm_eval_model(s, ckpt, device, models)
    # our engines record what they score per item (engine.ScoredTokens); lm-eval's HFLM and vLLM record nothing
    scored = getattr(model["model"], "scored", None)
    if isinstance(scored, ScoredTokens):
        scored.take()  # forget what a failed run left
    try:
        with qdq.installed():  # compressed-tensors' fake quantization, sooner on a CPU (same bits)
            r = evaluate_suite(
                suite,
                model,
                tasks,
                samples={t: samples[t] for t in tasks} if samples is not None else None,
                batch_size=s.batch_size,
                device=device,
            )
    except UsageError:  # the set's or the checkpoint's (a template, a blob): a ValueError, not lm-eval's failure
        raise
    except (OSError, ValueError) as e:
        raise RuntimeFailure(f"lm-eval could not score {ckpt}: {e}") from e
    check_identity(ckpt, ref.identity_sha256)  # what loaded and was scored is what the identity names
    check_threads(ckpt, run)
    wall = time.perf_counter() - t0
    took = scored.take() if isinstance(scored, ScoredTokens) else None
    task_docs = {}
    for task in tasks:
        cfg = r["configs"][task]
        # a request's doc_id counts the documents scored; a sample's is lm-eval's `indices[doc_id]` under `samples=`
        ids = samples[task] if samples is not None else None
        tokens = {ids[d] if ids else d: h for (t, d), h in took.items() if t == task} if took is not None else None
        items, filt = item_records(cfg["output_type"], r["samples"][task], golden.item_key(task), tokens)
        lm_results = {k: v for k, v in r["results"][task].items() if k != "alias" and isinstance(v, (int, float))}
        task_docs[task] = task_scores(cfg["output_type"], cfg["metadata"]["version"], items, lm_results, filt)
    return ScoreDoc(
        key=cache.score_key(suite, ref.identity_sha256, run),
        provenance=ScoreProvenance(
            checkpoint=ref,
            suite=SuiteRef(path=suite.path, name=s.name, sha256=suite.sha256, settings=s.settings()),
            golden=GoldenRef(**golden.provenance()),
            task_versions={t: task_docs[t].version for t in tasks},
            lm_eval_version=cache.lm_eval_version(),
            batch_size=s.batch_size,
            seed=s.seed,
            backend=Backend.llamacpp.value if gguf is not None else s.backend.value,
            device=device,
            dtype=run.dtype,
            trust_remote_code=run.trust_remote_code,
            engine=run.engine,
            cpu=run.cpu,
            threads=run.threads,
        ),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        wall_seconds=round(wall, 1),
        tasks=task_docs,
    )


class Staged:
    """A checkpoint scored in stages, one load: each call scores only the items not scored before and returns
    every item scored so far as one ScoreDoc (not cached: it is a sample). With `from_cache`, a checkpoint whose
    full scores are cached is read from the cache and costs nothing (a gate asks for that only on
    --trust-cached-candidate). `order`: each task's item ids in document order (the baseline's items), which maps
    an id to the index lm-eval's `samples=` takes."""

    def __init__(
        self,
        suite: OpenSuite,
        checkpoint: Path,
        order: dict[str, list[str]],
        models: LastModel,
        from_cache: bool = False,
    ) -> None:
        check_scorable(suite, checkpoint)
        self.suite, self.ckpt, self.models = suite, checkpoint, models
        self.ref = checkpoint_ref(checkpoint)
        self.index = {t: {i: n for n, i in enumerate(ids)} for t, ids in order.items()}
        run = runtime(suite, models.trust_remote_code, checkpoint)
        full = cache.lookup_scores(suite, self.ref.identity_sha256, run) if from_cache else None
        self.full = with_ref(full, self.ref) if full is not None else None
        self.items: dict[str, dict[str, dict[str, Any]]] = {t: {} for t in order}
        self.meta: dict[str, tuple[str, float | str, str | None]] = {}
        self._last: ScoreDoc | None = None
        self.seconds = 0.0
        self.calls: list[dict[str, int]] = []  # each lm-eval run: items scored per task (its batches follow from them)

    @property
    def cached(self) -> bool:
        return self.full is not None

    def score(self, ids: dict[str, list[str]]) -> ScoreDoc:
        """Every item of `ids` (task -> item ids) scored; returns all items scored so far of those tasks."""
        if self.full is not None:
            self._take(self.full, {t: set(v) for t, v in ids.items()})
        else:
            new = {t: sorted(self.index[t][i] for i in v if i not in self.items[t]) for t, v in ids.items()}
            if any(new.values()):
                self.calls.append({t: len(v) for t, v in new.items() if v})
                t0 = time.perf_counter()
                doc = run_lm_eval(self.suite, self.ckpt, self.ref, self.models, samples=new)
                self.seconds += time.perf_counter() - t0
                self._take(doc, None)
        assert self._last is not None, "score() was asked for no items"
        tasks = {}
        for t in ids:
            if self.items[t]:
                kind, version, filt = self.meta[t]
                items = sorted(self.items[t].values(), key=lambda i: self.index[t][i["id"]])
                tasks[t] = task_scores(kind, version, items, {}, filt)  # lm-eval's own figures cover one stage only
        return self._last.model_copy(update={"tasks": tasks, "wall_seconds": round(self.seconds, 1)})

    def _take(self, doc: ScoreDoc, wanted: dict[str, set[str]] | None) -> None:
        self._last = doc
        for t, ts in doc.tasks.items():
            if wanted is not None and t not in wanted:
                continue
            self.items[t].update({i.id: i.model_dump() for i in ts.items if wanted is None or i.id in wanted[t]})
            self.meta[t] = (ts.output_type, ts.version, getattr(ts, "filter", None))
