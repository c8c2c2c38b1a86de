"""`quantize golden size`: score both sides on a suite (cached), then per task the flip rate and the items a
margin needs (gates/sizing.py)."""

from __future__ import annotations

import math
from pathlib import Path

from quantize import stats
from quantize.checkpoint.files import BlobCheck
from quantize.checkpoint.loader import LastModel
from quantize.errors import UsageError
from quantize.evaluate.suite import open_suite
from quantize.flows.gate import check_target, load_scores
from quantize.gates.gate import check_provenance
from quantize.gates.sizing import size_tasks
from quantize.golden.items import MAX_TASK_ITEMS
from quantize.records import SizingReport


def check_computable(margin: float, alpha: float, power: float) -> None:
    """Before any scoring: the items a margin needs, ⌈(z₁₋α + z_power)² · σ_D² / m²⌉ (stats.n_required), are a
    number a golden set could hold. One flip among n items moves Δ by 1/n, so a margin under one item of the largest
    task a golden set holds (golden/items.MAX_TASK_ITEMS, about 2.5e9: its data file at the cap) is finer than any
    set resolves (and 1e-300 squared underflows to 0). An α whose z₁₋α is infinite (1 − α rounds to 1) gives no
    number at all. Each is exit 2 naming the flag."""
    if margin * MAX_TASK_ITEMS < 1:
        raise UsageError(
            f"--margin {margin} is finer than one item in the largest golden set this tool reads (a task holds at most "
            f"{MAX_TASK_ITEMS:,} items, where one flip moves Δ by {1 / MAX_TASK_ITEMS:.1e}): no golden set resolves "
            "it. Give the drop you mean to tolerate as a share, e.g. --margin 0.02 for two points"
        )
    if not math.isfinite(stats.z(1 - alpha)):
        raise UsageError(
            f"--alpha {alpha}: 1 − alpha rounds to 1, so its normal quantile (the bound's z) is infinite and no number "
            "of items reaches it; give a level such as --alpha 0.05"
        )


def run_sizing(
    suite_path: str | Path, baseline: Path, candidate: Path, margin: float, alpha: float, power: float
) -> SizingReport:
    if not 0 < margin < 1 or not 0 < alpha < 0.5 or not 0.5 < power < 1:
        raise UsageError(
            f"--margin {margin}, --alpha {alpha}, --power {power}: give 0 < margin < 1, 0 < alpha < 0.5, "
            "0.5 < power < 1"
        )
    check_computable(margin, alpha, power)
    suite = open_suite(suite_path)
    for p in (baseline, candidate):
        check_target(p)
    models = LastModel()
    names = BlobCheck([baseline, candidate])  # Hub blobs read back before anything is cached under their names
    base = load_scores(suite, baseline, models, before_store=names.wait)
    cand = load_scores(suite, candidate, models, before_store=names.wait)
    names.wait()
    check_provenance(base, cand)
    return SizingReport(
        golden=f"{suite.golden.manifest.name}/{suite.golden.manifest.version}",
        baseline=str(baseline),
        candidate=str(candidate),
        margin=margin,
        alpha=alpha,
        power=power,
        ppl_half_width=0.01,
        tasks=size_tasks(base, cand, margin, alpha, power),
    )
