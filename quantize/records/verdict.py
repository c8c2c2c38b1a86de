"""A gate verdict (`quantize gate --json`; CANDIDATE/gate.json, VERDICT_FILE, and its JUnit XML, JUNIT_FILE),
written by `quantize gate`: the policy's outcome, each rule's result with its evidence, the provenance of both
sides, and how a sequential gate ran."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from quantize.records.base import (
    AgreementMetric,
    CheckpointRef,
    GateOutcome,
    GoldenRef,
    OmitsUnset,
    Record,
    RuleOutcome,
    Strict,
    limit_outcome,
    non_finite_fields,
    noninferiority_outcome,
)

# A verdict saved beside its candidate, and its JUnit XML: the names `make gate-all`, a sweep's and a search's gates
# and the GitHub Action write, and that the report and a sweep's resume read (a Verdict, read through this model).
VERDICT_FILE = "gate.json"
JUNIT_FILE = "gate.xml"


class AccuracyEvidence(Strict):
    n: int
    clusters: int
    baseline: float
    candidate: float
    delta: float
    se_paired: float
    se_clustered: float
    se: float
    lower_bound: float
    upper_bound: float
    margin: float
    alpha: float
    flips_right_to_wrong: int
    flips_wrong_to_right: int
    mcnemar_p: float
    examples_right_to_wrong: list[str]
    min_detectable_drop: float
    items_needed: int | float | None  # float only for inf (no variance estimate)
    items_needed_at_estimate: int | float | None

    def outcome(self) -> RuleOutcome:
        """What Δ and the bounds give against the margin, by the gate's own decision."""
        return noninferiority_outcome(self.delta, self.lower_bound, self.upper_bound, self.margin)

    def judged(self) -> str:
        return f"Δ {self.delta}, bounds [{self.lower_bound}, {self.upper_bound}] against margin {self.margin}"

    def inconsistent(self) -> str | None:
        """Where its figures disagree with one another as the gate computes them (Δ is the candidate's mean less
        the baseline's, the bounds Δ ∓ q·SE, clipped to [-1, 1]), or None: a candidate of 0.99 above a baseline of
        0.25 and a Δ of +0.0 was published in model-index (a review)."""
        if not _close(self.candidate - self.baseline, self.delta):
            return (
                f"candidate {self.candidate} − baseline {self.baseline} is {self.candidate - self.baseline}, and its "
                f"Δ is {self.delta}"
            )
        if not _within(self.delta, self.lower_bound, self.upper_bound):
            return f"its Δ {self.delta} lies outside its own bounds [{self.lower_bound}, {self.upper_bound}]"
        return None


class PerplexityEvidence(Strict):
    n: int
    clusters: int
    baseline_perplexity: float
    candidate_perplexity: float
    ratio: float
    lower_bound: float
    upper_bound: float
    max_ratio: float
    alpha: float
    interval: str

    def outcome(self) -> RuleOutcome:
        """What the ratio's bounds give against max_ratio, by the gate's own decision."""
        return limit_outcome(self.lower_bound, self.upper_bound, at_most=self.max_ratio)

    def judged(self) -> str:
        return f"ratio bounds [{self.lower_bound}, {self.upper_bound}] against max_ratio {self.max_ratio}"

    def inconsistent(self) -> str | None:
        """Where its figures disagree as the gate computes them (the ratio is the candidate's perplexity over the
        baseline's: both are e to the same sums' means), or None. The bootstrap's percentile bounds need not hold
        the point estimate, and are not held to it."""
        if not _close(self.candidate_perplexity, self.ratio * self.baseline_perplexity):
            return (
                f"candidate perplexity {self.candidate_perplexity} over baseline perplexity "
                f"{self.baseline_perplexity} is not its ratio {self.ratio}"
            )
        return None


class AgreementEvidence(Strict):
    value: float
    se_clustered: float
    # top-1 only: Wilson's bounds over the positions at the rule's critical value; the bounds are the wider of
    # these and value ± q·SE
    wilson_bounds: tuple[float, float] | None = None
    lower_bound: float
    upper_bound: float
    max: float | None = None
    min: float | None = None
    alpha: float
    positions: int
    items: int
    clusters: int
    kl_p99: float | None = None
    note: str

    @model_validator(mode="after")
    def _one_limit(self) -> AgreementEvidence:
        if (self.max is None) == (self.min is None):
            raise ValueError(
                f"agreement evidence holds max {self.max} and min {self.min}: the gate records one limit, `max` for "
                "KL and `min` for top-1 and Σ min(p, q)"
            )
        return self

    def outcome(self) -> RuleOutcome:
        """What the bounds give against the rule's limit, by the gate's own decision."""
        return limit_outcome(self.lower_bound, self.upper_bound, at_most=self.max, at_least=self.min)

    def judged(self) -> str:
        limit = f"max {self.max}" if self.max is not None else f"min {self.min}"
        return f"bounds [{self.lower_bound}, {self.upper_bound}] against {limit}"

    def inconsistent(self) -> str | None:
        """Where its value lies outside its own bounds (value ∓ q·SE, widened to Wilson's for top-1, clipped to
        [0, 1] for a share: they hold the value), or None."""
        if not _within(self.value, self.lower_bound, self.upper_bound):
            return f"its value {self.value} lies outside its own bounds [{self.lower_bound}, {self.upper_bound}]"
        return None


# How far a verdict's figures may differ from what they follow from: float rounding of sums of thousands of items
# (a mean of differences against a difference of means), relative to the figures' size, never a real change
TOLERANCE = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def _within(x: float, lower: float, upper: float) -> bool:
    return lower - TOLERANCE * max(1.0, abs(lower)) <= x <= upper + TOLERANCE * max(1.0, abs(upper))


class _RuleResult(Strict):
    rule: str  # its label: the policy's `name:` or "<task> <metric>"
    verdict: RuleOutcome
    p_regression: float | None = None
    p_holm: float | None = None
    # sequential gate: the look (1-based) that decided it, or the last one taken (an agreement rule: its agreement
    # look; None: agreement measured once)
    look: int | None = None
    # set when the candidate's evidence held NaN or infinity: the rule is a regression whatever its statistics say
    non_finite: str | None = None


class AccuracyResult(_RuleResult):
    kind: Literal["accuracy"] = "accuracy"
    task: str
    metric: str | None = None  # the per-item metric compared (acc, acc_norm, exact_match@FILTER); None: written before
    evidence: AccuracyEvidence


class PerplexityResult(_RuleResult):
    kind: Literal["perplexity"] = "perplexity"
    task: str
    metric: str | None = None  # perplexity, word_perplexity, byte_perplexity; None: written before
    evidence: PerplexityEvidence


class AgreementRuleResult(_RuleResult):
    kind: Literal["agreement"] = "agreement"
    metric: AgreementMetric
    evidence: AgreementEvidence


class UntestedResult(Strict):
    """A rule a sequential gate never tested: it stopped at a regression found before the rule's task was
    scored (an agreement rule, measured before the first look). No evidence, no p-value: the verdict is
    settled by the regression, whatever this rule would have said."""

    kind: Literal["untested"] = "untested"
    rule: str
    task: str
    verdict: Literal["untested"] = "untested"
    reason: str
    p_regression: None = None
    p_holm: None = None
    look: None = None


RuleResult = Annotated[
    AccuracyResult | PerplexityResult | AgreementRuleResult | UntestedResult, Field(discriminator="kind")
]


class SideRef(OmitsUnset):
    OMITTED_WHEN_NONE = ("cpu", "threads")  # a side that names no machine: its verdict keeps its bytes of before

    checkpoint: CheckpointRef
    batch_size: int
    # a model that rounds activations, scored on a CPU: the CPU's name and torch's thread count, which its numbers
    # move with (ScoreProvenance's, quantize/evaluate/cache.py Runtime.rounding); absent for every other side
    cpu: str | None = None
    threads: int | None = None


class VerdictProvenance(Strict):
    baseline: SideRef
    candidate: SideRef
    golden: GoldenRef
    task_versions: dict[str, float | str]
    lm_eval_version: str
    seed: int
    suite: str
    # the suite settings both sides were scored with, as the gate compared them (all but the batch size: the report
    # holds a saved verdict to them); None in a verdict written before it said so
    suite_settings: dict[str, Any] | None = None
    # sha256 of the score file each side's evidence was read from (a cache entry or a file given on the command
    # line); None for a candidate scored in this run (its evidence read from no file): pin a baseline's with
    # `baseline_scores_sha256:`
    score_files: dict[str, str | None] = Field(default_factory=dict)
    # where the candidate's scores (and agreement) came from: "computed" in this run (in full or in stages),
    # "cache" (a restored cache's entry, only on --trust-cached-candidate), "file" (a score file given); None in a
    # verdict written before the gate said so (docs/reliability.md, "What a restored cache may supply")
    candidate_scores: Literal["computed", "cache", "file"] | None = None
    # where the baseline's scores came from: "checkpoint" (scored here from the checkpoint, or read from the score
    # cache under its identity), "file" (a score file or lm-eval's samples named on the command line); None in a
    # verdict written before the gate said so, or decided by the report (docs/reliability.md, "What a saved verdict
    # is worth": only a verdict on two checkpoints' evidence is kept as a gate's own)
    baseline_scores: Literal["checkpoint", "file"] | None = None
    # the policy as the gate applied it (gates/policy.Policy.settings: every field that can change a verdict, all but
    # its name and its suite's path); None in a verdict written before it said so. The report and a sweep hold a
    # saved verdict to it
    policy_settings: dict[str, Any] | None = None


class SequentialRecord(Strict):
    """How a sequential gate ran: its schedule and boundaries, how far it went, what it scored."""

    looks: list[float]  # planned cumulative fractions
    bounds: list[float]  # one-sided critical value at each look (Lan–DeMets O'Brien–Fleming spending)
    stable_margin: float
    stable_fraction: float
    task_stable_fraction: dict[str, float] = Field(default_factory=dict)  # per-task overrides of stable_fraction
    looks_taken: int  # 0: stopped by an agreement regression before the first look
    # agreement looks taken before the first (same schedule and bounds); None: agreement measured once, every item
    agreement_looks_taken: int | None = None
    items_scored: dict[str, int]  # candidate items scored per task
    items_total: dict[str, int]  # items in the golden set per task
    strata: dict[str, dict[str, int]]  # per task: items per stratum in the golden set
    candidate_seconds: float | None = None  # wall time spent scoring the candidate (None: from a cache)
    # the batch plan: the candidate's lm-eval runs in order, items per task each (lm-eval sorts one run's requests
    # by length and cuts them into batches of batch_size, so the run's items fix its batches); [] from a cache
    batch_size: int | None = None
    stage_runs: list[dict[str, int]] = Field(default_factory=list)
    agreement_runs: list[int] = Field(default_factory=list)  # staged agreement: agreement items each look scored
    agreement_seconds: float | None = None  # wall time of the staged agreement (the candidate's load included)


class Verdict(Record):
    WHAT: ClassVar[str] = "gate verdict"
    EVIDENCE: ClassVar[bool] = True
    REGENERATE: ClassVar[str] = "run `quantize gate POLICY --baseline B --candidate C --json` again"

    schema_version: Literal[2] = 2  # 2: checkpoint identities in the provenance
    policy: str
    verdict: GateOutcome
    exit_code: int
    rules: list[RuleResult]
    provenance: VerdictProvenance
    notes: list[str] = Field(default_factory=list)
    sequential: SequentialRecord | None = None  # None: the fixed design (every item scored)

    @model_validator(mode="after")
    def _outcome_of_its_rules(self) -> Verdict:
        """The outcome is what its rules give, and each rule's what its own evidence gives, as the gate decides
        them (gates/gate.verdict_of, and the rule's decision function): any regression rejects, with exit code 1;
        else any inconclusive rule makes it inconclusive (exit 0 or 1, as the policy's fail_on_inconclusive said);
        else it passes, with exit code 0. A rule holding non-finite evidence (or marked `non_finite`) is a
        regression; any other rule's outcome is its recorded bounds against its recorded limit by the function the
        gate decides it with (records/base.py: noninferiority_outcome, limit_outcome), and its figures follow from
        one another as the gate computes them, within float rounding (each evidence's `inconsistent`: an accuracy
        rule's Δ is candidate − baseline and lies within its bounds, a perplexity rule's ratio is the candidate's
        perplexity over the baseline's, an agreement rule's value lies within its bounds). A file that says
        otherwise was not written by the gate as it stands (a verdict of pass above a regression, a rule of pass
        whose lower bound is past its margin, a candidate of 0.99 with a Δ of +0.0 over a baseline of 0.25) and is
        refused wherever it is read (the report, a card, a sweep). Whether the figures are the ones the items give
        is not checked here: a gate.json beside a candidate is evidence only where the cache holds it as a gate's
        own decision (quantize/evaluate/cache.py `holds_verdict`), and `quantize card` publishes only such a one."""
        outcomes = {r.verdict for r in self.rules}
        expected = "rejected" if "regression" in outcomes else "inconclusive" if "inconclusive" in outcomes else "pass"
        codes = {"rejected": (1,), "inconclusive": (0, 1), "pass": (0,)}[expected]
        if self.verdict != expected or self.exit_code not in codes:
            raise ValueError(
                f"its verdict {self.verdict} (exit code {self.exit_code}) is not what its rules give "
                f"({expected}, exit code {' or '.join(map(str, codes))})"
            )
        for r in self.rules:
            if r.kind == "untested":
                continue
            if r.non_finite or (bad := non_finite_fields(r.evidence.model_dump())):
                if r.verdict != "regression":
                    raise ValueError(
                        f"rule {r.rule} is {r.verdict} on evidence that is not finite ({r.non_finite or bad[0]}), and "
                        "the gate makes non-finite evidence a regression"
                    )
            elif why := r.evidence.inconsistent():
                raise ValueError(
                    f"rule {r.rule}'s evidence does not hold together: {why}, and the gate records figures that "
                    "follow from one another (a file edited after its gate)"
                )
            elif r.verdict != (given := r.evidence.outcome()):
                raise ValueError(
                    f"rule {r.rule} is {r.verdict}, and its own evidence gives {given} ({r.evidence.judged()}, by the "
                    "gate's decision)"
                )
        return self

    def accuracy_evidence(self, task: str, metrics: tuple[str, ...] | None = None) -> AccuracyEvidence | None:
        """The evidence of the first accuracy rule on `task` (with `metrics`, one judging one of them; a verdict
        written before rules recorded their metric matches any), whatever the rule is named."""
        return next(
            (
                r.evidence
                for r in self.rules
                if isinstance(r, AccuracyResult)
                and r.task == task
                and (metrics is None or r.metric is None or r.metric in metrics)
            ),
            None,
        )


def is_verdict_file(raw: bytes) -> bool:
    """Whether `raw` is a verdict record the gate wrote, of this schema or an earlier one (what the GitHub Action's
    `verdict` path may replace): a JSON object holding `schema_version` and every field a Verdict requires."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    required = {"schema_version", *(n for n, f in Verdict.model_fields.items() if f.is_required())}
    return isinstance(data, dict) and required <= data.keys()
