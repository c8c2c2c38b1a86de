"""Score a checkpoint on a golden set with lm-eval, keep per-item records, cache by provenance.

The cache key is (checkpoint weights sha256, suite settings hash, golden manifest sha256,
lm-eval version, tasks): scoring the same baseline twice costs nothing the second time.

Per-item records (for paired comparison in the gate):
    multiple_choice        score = acc (0/1), ll = log p(gold choice | question), lls = every choice
    loglikelihood          score = acc (1 if the target is the greedy continuation), ll = log p(target | context)
    loglikelihood_rolling  ll = log p(document), with its words and bytes (perplexity is per document)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate.suite import Backend, Suite, load_suite
from quantize.golden.manifest import GoldenSet, lm_eval_tasks, verify
from quantize.io import write_json
from quantize.models import cache_dir, check_model_dir, weights_sha256

SCHEMA_VERSION = 1


def lm_eval_version() -> str:
    return metadata.version("lm_eval")


def cache_key(ckpt_sha: str, suite_hash: str, golden: GoldenSet, tasks: list[str]) -> str:
    blob = json.dumps([ckpt_sha, suite_hash, golden.manifest_sha256, lm_eval_version(), sorted(tasks)])
    return hashlib.sha256(blob.encode()).hexdigest()


def cache_path(key: str) -> Path:
    return cache_dir() / "scores" / f"{key[:32]}.json"


def _device(suite: Suite) -> str:
    import torch

    if suite.device != "auto":
        return suite.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def _dtype(suite: Suite, device: str) -> str:
    if suite.dtype != "auto":
        return suite.dtype
    return "float32" if device == "cpu" else "auto"


def _model_args(suite: Suite, ckpt: Path, device: str) -> str:
    args = {"pretrained": str(ckpt), "dtype": _dtype(suite, device), "trust_remote_code": False}
    if suite.max_length:
        args["max_length"] = suite.max_length
    if suite.backend is Backend.vllm and suite.vllm:
        args.update(suite.vllm.model_dump())
    return ",".join(f"{k}={v}" for k, v in args.items())


def item_records(output_type: str, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        doc, resps = s["doc"], s["filtered_resps"]
        rec: dict[str, Any] = {"id": doc["id"], "cluster": doc["cluster"]}
        if output_type == "multiple_choice":
            lls = [float(r[0]) for r in resps]
            gold = int(s["target"])
            rec.update(score=float(s["acc"]), ll=lls[gold], lls=lls)
        elif output_type == "loglikelihood":
            ll, greedy = resps[0]
            rec.update(score=float(bool(greedy)), ll=float(ll))
        elif output_type == "loglikelihood_rolling":
            ll = float(resps[0][0] if isinstance(resps[0], (list, tuple)) else resps[0])
            text = doc["text"]
            rec.update(score=ll, ll=ll, words=len(text.split()), bytes=len(text.encode("utf-8")))
        else:
            raise AssertionError(f"unexpected output type {output_type}")
        out.append(rec)
    return out


def _summary(output_type: str, items: list[dict[str, Any]], results: dict[str, Any]) -> dict[str, Any]:
    """Task-level figures from the items (so cached and fresh results agree) and lm-eval's own."""
    n = len(items)
    if output_type == "loglikelihood_rolling":
        ll = sum(i["ll"] for i in items)
        nbytes = sum(i["bytes"] for i in items)
        words = sum(i["words"] for i in items)
        return {"n": n, "bits_per_byte": -ll / nbytes / math.log(2), "word_perplexity": math.exp(-ll / words),
                "lm_eval": results}
    acc = sum(i["score"] for i in items) / n
    chance = (sum(1 / len(i["lls"]) for i in items) / n) if output_type == "multiple_choice" else 0.0
    return {"n": n, "acc": acc, "acc_se": math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else math.inf,
            "chance": chance, "mean_ll": sum(i["ll"] for i in items) / n, "lm_eval": results}


def score(suite_path: str | Path, checkpoint: str | Path, refresh: bool = False) -> dict[str, Any]:
    """Score a checkpoint; returns the result document (from the cache when it is there)."""
    suite, suite_hash = load_suite(suite_path)
    golden = verify(suite.golden)
    ckpt = Path(checkpoint)
    check_model_dir(ckpt)
    tasks = suite.tasks or golden.tasks
    unknown = sorted(set(tasks) - set(golden.tasks))
    if unknown:
        raise UsageError(f"suite {suite_path} names tasks the golden set lacks: {', '.join(unknown)}; it has {', '.join(golden.tasks)}")
    ckpt_sha = weights_sha256(ckpt)
    key = cache_key(ckpt_sha, suite_hash, golden, tasks)
    cached = cache_path(key)
    if cached.is_file() and not refresh:
        doc = json.loads(cached.read_text())
        doc["cached"] = True
        return doc

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    device = _device(suite)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="quantize-tasks-") as tmp:
        ids = golden.manifest["smoke_ids"] if suite.subset == "smoke" else None
        include = lm_eval_tasks(golden, Path(tmp), ids=ids)
        try:
            r = simple_evaluate(
                model=suite.backend.value, model_args=_model_args(suite, ckpt, device), tasks=tasks,
                task_manager=TaskManager(include_path=str(include), include_defaults=False),
                batch_size=suite.batch_size, device=device, log_samples=True,
                random_seed=suite.seed, numpy_random_seed=suite.seed, torch_random_seed=suite.seed,
                fewshot_random_seed=suite.seed,
                # our own statistics come from the per-item records; lm-eval's bootstrap stderr forks a
                # multiprocessing pool inside a threaded torch process, which can deadlock
                bootstrap_iters=0,
            )
        except (OSError, ValueError) as e:
            raise RuntimeFailure(f"lm-eval could not score {ckpt}: {e}") from e
    wall = time.perf_counter() - t0
    task_docs = {}
    for task in tasks:
        cfg = r["configs"][task]
        items = item_records(cfg["output_type"], r["samples"][task])
        lm_results = {k: v for k, v in r["results"][task].items() if k != "alias" and isinstance(v, (int, float))}
        task_docs[task] = {"output_type": cfg["output_type"], "version": cfg["metadata"]["version"],
                           **_summary(cfg["output_type"], items, lm_results), "items": items}
    doc = {
        "schema_version": SCHEMA_VERSION,
        "key": key,
        "provenance": {
            "checkpoint": {"path": str(ckpt), "weights_sha256": ckpt_sha},
            "suite": {"path": str(suite_path), "name": suite.name, "sha256": suite_hash, "settings": suite.settings()},
            "golden": golden.provenance(),
            "task_versions": {t: task_docs[t]["version"] for t in tasks},
            "lm_eval_version": lm_eval_version(),
            "batch_size": suite.batch_size,
            "seed": suite.seed,
            "backend": suite.backend.value,
            "device": device,
            "dtype": _dtype(suite, device),
        },
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_seconds": round(wall, 1),
        "tasks": task_docs,
    }
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_json(cached, doc)
    doc["cached"] = False
    return doc
