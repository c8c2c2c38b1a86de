"""`quantize agree`: token-distribution agreement of many checkpoints with one baseline (cached), a minute or
two per checkpoint on a CPU where accuracy scores take a quarter of an hour; the report and the gate reuse it."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from quantize import progress
from quantize.checkpoint import finite
from quantize.checkpoint.files import check_loadable, check_model_dir, checkpoint_folders, identity_sha256
from quantize.errors import UsageError
from quantize.evaluate import cache
from quantize.evaluate.agreement import agreement_scores
from quantize.evaluate.engine import gguf_to_score
from quantize.evaluate.score import runtime
from quantize.evaluate.suite import OpenSuite, open_suite
from quantize.flows.gate import other_tokenizer
from quantize.quiet import quiet_libraries
from quantize.records import AgreementResult
from quantize.tables import first_named


@dataclass(frozen=True)
class Agreement:
    suite: OpenSuite
    baseline: Path
    results: list[tuple[Path, AgreementResult]]
    skipped: list[str]  # one line per checkpoint that could not be measured here and had nothing cached
    # one warning per checkpoint measured (the baseline too) whose weights store NaN or infinity (its agreement may be
    # finite all the same: stored_non_finite)
    non_finite: list[str] = field(default_factory=list)


def measurable(
    suite: OpenSuite, baseline: Path, found: list[Path], run: Callable[[Path], cache.Runtime]
) -> tuple[list[Path], list[str]]:
    """The candidates this environment can measure, or whose result is cached; one of several that can be
    neither is skipped with the reason (a folder of outputs), a lone one is the user's error. So is, before
    anything is measured, one whose tokenizer differs from the baseline's (the gate's check,
    gate.other_tokenizer): agreement over two vocabularies means nothing, cached or not."""
    candidates, skipped = [], []
    for c in found:
        try:
            if gguf_to_score(c) is None:
                check_model_dir(c)
                check_loadable(c)
        except UsageError as e:
            if len(found) == 1:
                raise
            try:  # one without an identity (no weights at all) has nothing cached either
                ids = identity_sha256(baseline), identity_sha256(c)
                cached = cache.lookup_agreement(suite, *ids, run(c), run(baseline))
            except UsageError:
                cached = None
            if cached is None:
                skipped.append(f"{c}: not measured here: {e}")
                continue
        else:
            if (why := _other_tokenizer(baseline, c)) is not None:
                if len(found) == 1:
                    raise UsageError(f"{why}: {AGREE_NEEDS_ONE_VOCABULARY}")
                skipped.append(f"{c}: not measured: {why}")
                continue
        candidates.append(c)
    return candidates, skipped


AGREE_NEEDS_ONE_VOCABULARY = (
    "token agreement (KL, top-1, Σ min over the baseline's top-k) compares the two models' distributions token by "
    "token, which two vocabularies do not share. Measure a candidate that keeps its baseline's tokenizer"
)


def _other_tokenizer(baseline: Path, candidate: Path) -> str | None:
    """gate.other_tokenizer for two checkpoint folders; None where either side is a GGUF (its tokens are compared
    with the other side's, item by item, before it is measured: evaluate/tokens.py)."""
    if gguf_to_score(baseline) is not None or gguf_to_score(candidate) is not None:
        return None
    return other_tokenizer(baseline, candidate)


def agree_many(
    suite_path: str | Path,
    baseline: Path,
    given: list[str],
    trust_remote_code: bool,
    quiet: bool,
    before_store: Callable[[], None] | None = None,
) -> Agreement:
    """Every candidate measured against the baseline; `before_store` is called before anything measured is cached
    (api.agreement: the identities' Hub blob names checked)."""
    from quantize.evaluate.tokens import check_same_tokens

    suite = open_suite(suite_path)
    if gguf_to_score(baseline) is None:  # a GGUF baseline is scored in llama.cpp, as a GGUF candidate is
        check_model_dir(baseline)
        check_loadable(baseline)
    found = [c for c in checkpoint_folders(given) if c.resolve() != baseline.resolve()]
    candidates, skipped = measurable(suite, baseline, found, lambda c: runtime(suite, trust_remote_code, c))
    base_id = identity_sha256(baseline)  # read once, not once per candidate
    results = []
    for n, c in enumerate(candidates, 1):
        with quiet_libraries(quiet), progress.stage(f"agree: checkpoint {n} of {len(candidates)} ({c.name})"):
            if gguf_to_score(c) is not None or gguf_to_score(baseline) is not None:  # either side in llama.cpp:
                # every item's tokens checked against the other side's first
                check_same_tokens(suite, baseline, c, trust_remote_code)
            # a LastModel per candidate: the baseline (loaded for its top-k only when the cache lacks it) and each
            # candidate are released before the next loads; the gc pass below frees anything a reference cycle held
            result = agreement_scores(
                suite, baseline, c, base_id, trust_remote_code=trust_remote_code, before_store=before_store
            )
            results.append((c, result))
        gc.collect()
    stored = [w for c in (baseline, *(c for c, _ in results)) if (w := stored_non_finite(c))]  # the baseline's too
    return Agreement(suite, baseline, results, skipped, stored)


def stored_non_finite(checkpoint: Path) -> str | None:
    """The warning for a checkpoint that stores NaN or infinity in a tensor (finite.non_finite_tensors), else
    None: its distributions can be finite where its weights are not (an embedding row of a token no item holds is
    never read; llama.cpp rounds an activation to 8 bits before a Q8_0 matrix, where a NaN element becomes finite),
    so its agreement says nothing of it, and a gate fails every rule on it."""
    if not (bad := finite.non_finite_tensors(checkpoint)):
        return None
    return (
        f"warning: {checkpoint} stores NaN or infinity in {len(bad)} tensor(s) ({first_named(bad)}): its "
        "agreement is measured as computed, and a gate counts every rule on it as a regression"
    )
