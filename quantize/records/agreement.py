"""An agreement result ($QUANTIZE_CACHE/agreement/cmp-*.json), written by the agreement scorer: a candidate's
token distributions against its baseline's stored top-k."""

from __future__ import annotations

from typing import ClassVar, Literal

from quantize.records.base import AgreementMetric, Record


class AgreementResult(Record):
    """Token-distribution agreement of a candidate with its baseline's stored top-k."""

    WHAT: ClassVar[str] = "agreement result"
    EVIDENCE: ClassVar[bool] = True
    REGENERATE: ClassVar[str] = "delete it; the next `quantize gate` computes it again"

    # 2: keyed by checkpoint identities (weights, config, tokenizer); 1 and unversioned files named
    # weights only, so they cannot be migrated
    schema_version: Literal[2] = 2
    positions: int
    items: int
    clusters: int
    kl_mean: float
    kl_se: float
    kl_p99: float
    top1: float
    top1_se: float
    sum_min: float
    sum_min_se: float
    note: str
    baseline_identity: str
    candidate_identity: str
    top_k: int
    per_task: int
    tasks: list[str]

    def estimate(self, metric: AgreementMetric) -> tuple[float, float]:
        """(value, clustered SE) of one metric."""
        return {
            AgreementMetric.kl: (self.kl_mean, self.kl_se),
            AgreementMetric.top1: (self.top1, self.top1_se),
            AgreementMetric.sum_min: (self.sum_min, self.sum_min_se),
        }[metric]
