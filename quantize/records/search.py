"""OUTPUT/search.json, written by `quantize search`: the layer groups measured, the allocations compared, and
each try with its verdict (the winner's quantize.json points back here: run.SearchRef)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from quantize.records.base import GateOutcome, Record, Strict


class UnitRecord(Strict):
    name: str
    parameters: int
    bytes: dict[str, int]  # option -> true bytes of the unit's weights
    kl: dict[str, float]  # option -> mean KL with the unit alone quantized so


class AllocationRecord(Strict):
    label: str  # "searched", "random 1", "first and last blocks at W8A16", "try 2"
    bytes: int  # predicted true bytes of the whole model
    bits_per_weight: float
    predicted_kl: float  # Σ of the units' KL (additive model)
    holdout_kl: float | None  # measured with every unit quantized so, on held-out agreement items
    holdout_top1: float | None
    options: dict[str, int]  # option -> number of units
    allocation: dict[str, str]  # unit -> option


class TryRecord(Strict):
    allocation: AllocationRecord
    gated: bool  # False: not gated (`note` says why: outside the policy's agreement limits, or left by the bisection)
    checkpoint: str | None
    true_bytes: int | None  # read back from the written checkpoint
    verdict: GateOutcome | None
    failed_rules: list[str]
    note: str = ""  # why it was not gated


class SearchReport(Record):
    """search.json: what `quantize search` measured, compared and tried."""

    WHAT: ClassVar[str] = "search report"
    REGENERATE: ClassVar[str] = "run `quantize search SPEC` again (sensitivities are cached)"

    schema_version: Literal[1] = 1
    created: str
    spec: str
    spec_sha256: str
    resolved: dict[str, Any]
    model: str
    policy: str
    budgets_bits: list[float]
    source_parameters: int
    fixed_bytes: int
    smallest_bits_per_weight: float
    sensitivity_key: str
    sensitivity_seconds: float
    items: dict[str, int]  # "sensitivity" / "holdout" -> agreement items
    units: list[UnitRecord]
    comparisons: list[AllocationRecord]
    tries: list[TryRecord]
    result: str | None  # the checkpoint that passed, or None
    drivers: list[str]  # when none passed: the layer groups that damage most at the base option
