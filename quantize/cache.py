"""The evaluation cache: where scores and agreement results live, keyed by their provenance.

The one place that builds cache keys and paths. Scorers store through it, the gate and the report
look up through it; nothing else re-derives a key. Nothing here loads a model.

    scores     $QUANTIZE_CACHE/scores/KEY.json    KEY = sha256(checkpoint identity, suite settings, golden manifest,
                                                               lm-eval version, tasks)
    agreement  $QUANTIZE_CACHE/agreement/base-B-K.npz       the baseline's top-k, K = agreement settings
               $QUANTIZE_CACHE/agreement/cmp-B-C-K.json     a candidate against it
    search     $QUANTIZE_CACHE/search/sensitivity-KEY.json  KEY = sha256(model identity, base recipe, options,
                                                               unit, golden manifest, suite, per_task, top_k,
                                                               device kind, dtype)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from quantize import records
from quantize.io import sha256_json
from quantize.records import AgreementResult, ScoreDoc, SensitivityRecord
from quantize.suite import OpenSuite


def cache_dir() -> Path:
    """$QUANTIZE_CACHE, default ~/.cache/quantize: the default model, scores and agreement results."""
    return Path(os.environ.get("QUANTIZE_CACHE") or Path.home() / ".cache" / "quantize")


@contextmanager
def claimed(entry: Path) -> Iterator[None]:
    """Hold an exclusive lock on a cache entry while it is computed: a second process scoring the same
    checkpoint waits here, then finds the first one's result instead of scoring again."""
    import fcntl

    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(entry.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def lm_eval_version() -> str:
    return metadata.version("lm_eval")


def score_key(suite: OpenSuite, ckpt_id: str) -> str:
    return sha256_json([ckpt_id, suite.sha256, suite.golden.manifest_sha256, lm_eval_version(), sorted(suite.tasks)])


def score_path(suite: OpenSuite, ckpt_id: str) -> Path:
    return cache_dir() / "scores" / f"{score_key(suite, ckpt_id)[:32]}.json"


def lookup_scores(suite: OpenSuite, ckpt_id: str) -> ScoreDoc | None:
    p = score_path(suite, ckpt_id)
    return records.read(ScoreDoc, p) if p.is_file() else None


def store_scores(suite: OpenSuite, doc: ScoreDoc) -> None:
    records.write(score_path(suite, doc.provenance.checkpoint.identity_sha256), doc)


def _agreement_key(suite: OpenSuite) -> str:
    a = suite.suite.agreement
    return sha256_json([sorted(suite.agreement_tasks), a.per_task, a.top_k, suite.golden.manifest_sha256])[:16]


def baseline_topk_path(suite: OpenSuite, base_id: str) -> Path:
    return cache_dir() / "agreement" / f"base-{base_id[:16]}-{_agreement_key(suite)}.npz"


def agreement_path(suite: OpenSuite, base_id: str, cand_id: str) -> Path:
    return cache_dir() / "agreement" / f"cmp-{base_id[:16]}-{cand_id[:16]}-{_agreement_key(suite)}.json"


def lookup_agreement(suite: OpenSuite, base_id: str, cand_id: str) -> AgreementResult | None:
    p = agreement_path(suite, base_id, cand_id)
    return records.read(AgreementResult, p) if p.is_file() else None


def store_agreement(suite: OpenSuite, result: AgreementResult) -> None:
    records.write(agreement_path(suite, result.baseline_identity, result.candidate_identity), result)


def sensitivity_key(suite: OpenSuite, model_id: str, measured: dict[str, Any]) -> str:
    """`measured`: what the search's sensitivities depend on besides the model and suite (its base recipe,
    options, unit, items per task, top-k, and the device kind and dtype the model ran in)."""
    return sha256_json(
        {"v": 2, "model": model_id, "golden": suite.golden.manifest_sha256, "suite": suite.sha256, **measured}
    )


def sensitivity_path(key: str) -> Path:
    return cache_dir() / "search" / f"sensitivity-{key[:32]}.json"


def lookup_sensitivity(key: str) -> SensitivityRecord | None:
    p = sensitivity_path(key)
    return records.read(SensitivityRecord, p) if p.is_file() else None


def store_sensitivity(record: SensitivityRecord) -> None:
    p = sensitivity_path(record.key)
    p.parent.mkdir(parents=True, exist_ok=True)
    records.write(p, record)
