"""Scores and agreement as text: `quantize eval` and `quantize agree`."""

from __future__ import annotations

from pathlib import Path

from quantize.kinds import headline, kind_of
from quantize.records import AgreementResult, ScoreDoc
from quantize.tables import counted, first_named, printable
from quantize.tables import text_table as table


def score_text(doc: ScoreDoc, cached: bool) -> str:
    p = doc.provenance
    took = "cached" if cached else f"{doc.wall_seconds:.0f} s"
    if p.samples:  # read from an lm-eval run's samples (evaluate/samples.py): its engine computed them
        took = f"read from {p.engine}, {doc.wall_seconds:.0f} s in lm-eval"
    if p.cpu is not None:  # an activation-rounding model's numbers move with both (evaluate/cache.Runtime.rounding)
        took += f"; on {printable(p.cpu)}, {counted(p.threads or 0, 'thread')}"
    rows = []
    for task, d in doc.tasks.items():
        h = headline(d)  # none where an item is not finite (lm-eval's acc over NaN log-likelihoods is no score)
        se = f"± {h.se:.4f}" if h.se is not None else ("" if not kind_of(d).right_wrong or h.non_finite else "± -")
        chance = f"{d.chance:.2f}" if hasattr(d, "chance") else ""
        rows.append([task, h.metric, h.text(), se, d.n, chance, f"v{d.version}"])
        for name, value in getattr(d, "metrics", {}).items():  # the task's other per-item metrics (acc_norm, ...)
            rows.append(["", name, "non-finite" if h.non_finite else f"{value:.4f}", "", d.n, "", ""])
    return (
        f"{p.checkpoint.path}  (identity {p.checkpoint.identity_sha256[:12]}; golden {p.golden.name}/"
        f"{p.golden.version}; lm-eval {p.lm_eval_version}; {took})\n"
        + table(rows, ["task", "metric", "value", "SE", "n", "chance", "version"])
    )


def non_finite_warnings(doc: ScoreDoc) -> list[str]:
    """One warning per task whose items hold NaN or infinity: the scores are recorded as computed, and a gate
    counts them as a regression. Before them, one for a checkpoint storing NaN or infinity in a tensor (its scores
    may be finite: a NaN embedding row of a token no item holds is never read, and llama.cpp rounds some
    activations to 8 bits, where a NaN element becomes a finite one)."""
    stored = [
        f"warning: {doc.provenance.checkpoint.path} stores NaN or infinity in {len(bad)} tensor(s) "
        f"({first_named(bad)}); its scores are recorded as "
        "computed, and a gate counts every rule on it as a regression"
        for bad in [doc.provenance.checkpoint.non_finite_tensors]
        if bad
    ]
    return stored + [
        f"warning: {task}: {len(ids)} of {doc.tasks[task].n} item(s) scored NaN or infinity "
        f"(e.g. {', '.join(ids[:3])}); the checkpoint computes non-finite log-likelihoods (or generates from "
        "non-finite logits): recorded as such, and a gate counts them as a regression"
        for task, ids in doc.non_finite().items()
    ]


def agreement_text(baseline: Path, golden: Path, per_task: int, results: list[tuple[Path, AgreementResult]]) -> str:
    rows = [
        [
            str(c),
            f"{a.kl_mean:.4f} ± {a.kl_se:.4f}",
            f"{a.kl_p99:.3f}",
            f"{a.top1:.3f}",
            f"{a.sum_min:.3f}",
            a.positions,
        ]
        for c, a in results
    ]
    return (
        f"agreement with {baseline} on {golden} ({per_task} items per task; "
        "KL is a lower bound from the baseline's top-k, Σ min(p, q) the acceptance rate as a draft)\n"
        + table(rows, ["checkpoint", "mean KL ± SE", "KL p99", "top-1", "Σ min(p, q)", "positions"])
    )
