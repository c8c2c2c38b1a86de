"""Sizing a golden set from two scored checkpoints (`quantize golden size`): pure functions on score records.

For a right/wrong task with n paired items, flips b (right→wrong) and c (wrong→right), Dᵢ = s_candᵢ − s_baseᵢ:

    flip rate        (b + c) / n
    σ_D              SE · √n, SE the one the gate uses (Agresti–Min paired, or cluster-robust when larger)
    smallest drop    (z₁₋α + z_power) · σ_D / √n          detected at this n (stats.min_detectable)
    items needed     ⌈(z₁₋α + z_power)² · σ_D² / m²⌉     to resolve a drop of m (stats.n_required)

For a perplexity task (per-document log-likelihoods) the gate's cluster bootstrap gives the ratio r and its
upper bound u; the relative half-width u/r − 1 shrinks as 1/√n, so documents for a relative half-width h
≈ n · ((u/r − 1) / h)².
"""

from __future__ import annotations

import math

from quantize import stats
from quantize.gates.gate import item_value
from quantize.kinds import kind_of
from quantize.records import AccuracySizing, PerplexitySizing, ScoreDoc


def size_tasks(
    base: ScoreDoc, cand: ScoreDoc, margin: float, alpha: float, power: float, ppl_half_width: float = 0.01
) -> list[AccuracySizing | PerplexitySizing]:
    rows = []
    for task in sorted(set(base.tasks) & set(cand.tasks)):
        b = {i.id: i for i in base.tasks[task].items}
        c = {i.id: i for i in cand.tasks[task].items}
        ids = sorted(set(b) & set(c))
        clusters = [b[i].cluster for i in ids]
        if kind_of(base.tasks[task]).right_wrong:
            first = b[ids[0]].metrics if ids else {}
            for metric in ["acc", *(m for m in first if all(m in c[i].metrics for i in ids))]:
                d = [item_value(c[i], metric, task) - item_value(b[i], metric, task) for i in ids]
                rows.append(_accuracy_sizing(task, metric, d, clusters, margin, alpha, power))
        else:
            w = [b[i].units for i in ids]
            ratio, _, hi = stats.bootstrap_ppl_ratio(
                [-b[i].ll for i in ids], [-c[i].ll for i in ids], w, clusters, alpha, seed=base.provenance.seed
            )
            half = hi / ratio - 1
            rows.append(
                PerplexitySizing(
                    task=task,
                    n=len(ids),
                    clusters=len(set(clusters)),
                    ratio=ratio,
                    upper_bound=hi,
                    half_width=half,
                    documents_needed=math.ceil(len(ids) * (half / ppl_half_width) ** 2) if half > 0 else len(ids),
                )
            )
    return rows


def _accuracy_sizing(
    task: str,
    metric: str,
    d: list[float],
    clusters: list[str],
    margin: float,
    alpha: float,
    power: float,
) -> AccuracySizing:
    """Dᵢ = s_candᵢ − s_baseᵢ of one metric; the module docstring's figures."""
    r = stats.noninferiority(d, clusters, margin, alpha, power)
    return AccuracySizing(
        task=task,
        metric=metric,
        n=r.n,
        clusters=r.clusters,
        flip_rate=sum(x != 0 for x in d) / r.n,
        right_to_wrong=sum(x < 0 for x in d),
        wrong_to_right=sum(x > 0 for x in d),
        delta=r.delta,
        se=r.se,
        min_detectable_drop=r.min_detectable,
        items_needed=r.n_needed,
    )
