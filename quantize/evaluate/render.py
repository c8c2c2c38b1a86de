"""Scores and agreement as text: `quantize eval` and `quantize agree`."""

from __future__ import annotations

from pathlib import Path

from quantize.records import AgreementResult, GenerationTask, RollingTask, ScoreDoc
from quantize.tables import text_table as table


def score_text(doc: ScoreDoc, cached: bool) -> str:
    p = doc.provenance
    took = "cached" if cached else f"{doc.wall_seconds:.0f} s"
    rows = []
    for task, d in doc.tasks.items():
        if isinstance(d, RollingTask):
            rows.append([task, "bits/byte", f"{d.bits_per_byte:.4f}", "", d.n, "", f"v{d.version}"])
        elif isinstance(d, GenerationTask):
            em = f"exact_match,{d.filter}"
            rows.append([task, em, f"{d.acc:.4f}", f"± {d.acc_se:.4f}", d.n, "", f"v{d.version}"])
        else:
            rows.append([task, "acc", f"{d.acc:.4f}", f"± {d.acc_se:.4f}", d.n, f"{d.chance:.2f}", f"v{d.version}"])
    return (
        f"{p.checkpoint.path}  (identity {p.checkpoint.identity_sha256[:12]}; golden {p.golden.name}/"
        f"{p.golden.version}; lm-eval {p.lm_eval_version}; {took})\n"
        + table(rows, ["task", "metric", "value", "SE", "n", "chance", "version"])
    )


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
