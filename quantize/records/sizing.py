"""A sizing report (`quantize golden size --json`), written by `quantize golden size`: per task, what a pair
of checkpoints says about a golden set's size (gates/sizing.py)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from quantize.records.base import Record, Strict


class AccuracySizing(Strict):
    """A right/wrong task's flips between two checkpoints and what its size can resolve (gates/sizing.py)."""

    kind: Literal["right/wrong"] = "right/wrong"
    task: str
    metric: str = "acc"  # the kind's own score, or a per-item metric of the task (acc_norm, exact_match@FILTER)
    n: int
    clusters: int
    flip_rate: float
    right_to_wrong: int
    wrong_to_right: int
    delta: float
    se: float
    min_detectable_drop: float
    items_needed: int | float  # a count, or inf where no number of items would resolve the margin


class PerplexitySizing(Strict):
    kind: Literal["perplexity"] = "perplexity"
    task: str
    n: int
    clusters: int
    ratio: float
    upper_bound: float
    half_width: float  # u / r − 1 of the gate's bootstrap bound
    documents_needed: int


class SizingReport(Record):
    """`quantize golden size --json`: per task, what a pair of checkpoints says about the set's size."""

    WHAT: ClassVar[str] = "sizing report"
    REGENERATE: ClassVar[str] = "run `quantize golden size SUITE --baseline B --candidate C --json` again"
    EVIDENCE: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    golden: str
    baseline: str
    candidate: str
    margin: float
    alpha: float
    power: float
    ppl_half_width: float
    tasks: list[Annotated[AccuracySizing | PerplexitySizing, Field(discriminator="kind")]]
