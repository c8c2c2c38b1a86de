"""`quantize golden size`: score both sides on a suite (cached), then per task the flip rate and the items a
margin needs (gates/sizing.py)."""

from __future__ import annotations

from pathlib import Path

from quantize.checkpoint.files import BlobCheck
from quantize.checkpoint.loader import LastModel
from quantize.errors import UsageError
from quantize.evaluate.suite import open_suite
from quantize.flows.gate import check_target, load_scores
from quantize.gates.gate import check_provenance
from quantize.gates.sizing import size_tasks
from quantize.records import SizingReport


def run_sizing(
    suite_path: str | Path, baseline: Path, candidate: Path, margin: float, alpha: float, power: float
) -> SizingReport:
    if not 0 < margin < 1 or not 0 < alpha < 0.5 or not 0.5 < power < 1:
        raise UsageError(
            f"--margin {margin}, --alpha {alpha}, --power {power}: give 0 < margin < 1, 0 < alpha < 0.5, "
            "0.5 < power < 1"
        )
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
