"""Gate policies (gates/*.yaml): which rules a candidate must pass against its baseline."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from quantize.config import Wording, beside_repo, load_yaml
from quantize.kinds import kinds_for
from quantize.records import AgreementMetric


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None


class AccuracyRule(_Rule):
    """Non-inferiority of a right/wrong share: pass when Δ − z·SE > −margin. `acc` on multiple-choice and
    greedy-continuation tasks, `exact_match` (or `acc`) on generation tasks (the first filter pipeline's), or any
    per-item metric the task defines, as lm-eval names it: `acc_norm`, `exact_match@flexible-extract`
    (checked against the task before any scoring)."""

    task: str
    metric: str = Field("acc", pattern=r"^[A-Za-z0-9_.]+(@[A-Za-z0-9_.\-]+)?$")
    margin: float = Field(gt=0, lt=1, description="absolute drop tolerated, e.g. 0.02 = two points")


PERPLEXITIES = ("perplexity", "word_perplexity", "byte_perplexity")


class PerplexityRule(_Rule):
    """Perplexity ratio candidate/baseline from paired per-document log-likelihoods (cluster bootstrap):
    per target on a loglikelihood task; per word (`perplexity`, `word_perplexity`) or per byte
    (`byte_perplexity`) on a rolling one."""

    task: str
    metric: Literal["perplexity", "word_perplexity", "byte_perplexity"] = "perplexity"
    max_ratio: float = Field(gt=1, allow_inf_nan=False, description="e.g. 1.05: at most 5% higher perplexity")


class AgreementRule(_Rule):
    """A tolerance on token-distribution agreement: the confidence bound must sit inside the limit."""

    agreement: AgreementMetric
    max: float | None = Field(None, gt=0, allow_inf_nan=False)  # `.inf` was a limit no evidence meets
    min: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)

    @model_validator(mode="after")
    def _limit(self) -> AgreementRule:
        if self.agreement is AgreementMetric.kl and (self.max is None or self.min is not None):
            raise ValueError("an agreement: kl rule takes `max:` (the largest mean KL tolerated) and no `min:`")
        if self.agreement is not AgreementMetric.kl and (self.min is None or self.max is not None):
            raise ValueError(
                f"an agreement: {self.agreement.value} rule takes `min:` (the smallest value tolerated) and no `max:`"
            )
        return self


def _kind(v: object) -> str | None:
    """The rule kind of a mapping (or a rule); None for anything else, which pydantic reports as a bad rule."""
    if isinstance(v, dict):
        if "agreement" in v:
            return "agreement"
        return "perplexity" if v.get("metric") in PERPLEXITIES else "accuracy"
    return {AccuracyRule: "accuracy", PerplexityRule: "perplexity", AgreementRule: "agreement"}.get(type(v))


# which task output types each kind's own metric can judge (quantize/kinds.py); a task's other per-item metrics
# come from its YAML (GoldenSet.item_metrics)
RULE_OUTPUT_TYPES = {m: kinds_for(m) for m in ("acc", "exact_match", *PERPLEXITIES)}


Rule = Annotated[
    Annotated[AccuracyRule, Tag("accuracy")]
    | Annotated[PerplexityRule, Tag("perplexity")]
    | Annotated[AgreementRule, Tag("agreement")],
    Discriminator(_kind),
]


class Sequential(BaseModel):
    """A gate in stages: the candidate is scored on a growing, baseline-stratified sample of each task and every
    rule is tested after each stage against group-sequential boundaries (quantize/stats.py); it stops once the
    verdict is settled. Part of the verdict's provenance."""

    model_config = ConfigDict(extra="forbid")

    looks: list[float] = Field(
        default_factory=lambda: [0.2, 0.5, 1.0],
        description="cumulative fractions of each stratum's planned items at which the rules are tested; the last is 1",
    )
    stable_margin: float = Field(
        3.0,
        ge=0,
        description="an item is 'stable' when the baseline's answer wins (or loses) by at least this many nats: "
        "log-odds of the gold answer against the best other choice (multiple choice), of the target's probability "
        "(greedy continuation); 0: one stratum",
    )
    stable_fraction: float = Field(
        0.5, gt=0, le=1, description="share of the stable items drawn by the last look (every at-risk item is drawn)"
    )
    task_stable_fraction: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict,
        description="stable_fraction for named tasks, set from their measured flip rates (a task whose stable "
        "items flip too often to sample them: 1.0)",
    )

    def fraction(self, task: str) -> float:
        """The share of `task`'s stable items drawn by the last look."""
        return self.task_stable_fraction.get(task, self.stable_fraction)

    @model_validator(mode="after")
    def _schedule(self) -> Sequential:
        t = self.looks
        if not 1 <= len(t) <= 10 or any(not 0 < x <= 1 for x in t) or any(b <= a for a, b in pairwise(t)):
            raise ValueError(
                f"sequential.looks {t} is not a look schedule: give 1 to 10 increasing fractions in (0, 1], "
                "e.g. [0.2, 0.5, 1.0]"
            )
        if t[-1] != 1:
            raise ValueError(
                f"sequential.looks {t} ends at {t[-1]}: the last look must be 1 (every planned item), or the "
                "alpha the boundaries spend is never fully spent"
            )
        return self


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    suite: str = Field(description="evaluation suite the scores come from, e.g. evaluate/core.yaml")
    alpha: float = Field(0.05, gt=0, lt=0.5, description="one-sided level of every bound")
    power: float = Field(0.8, gt=0.5, lt=1, description="power used for 'items needed' and the detectable effect")
    fail_on_inconclusive: bool = True
    rules: list[Rule] = Field(min_length=1)
    sequential: Sequential | None = Field(None, description="stop early in stages; absent: every item is scored")
    allow_different_tokenizer: bool = Field(
        False, description="gate a candidate whose vocabulary differs from the baseline's (accuracy rules only)"
    )
    baseline_scores_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="the sha256 of the only baseline score file this policy accepts (a verdict's "
        "provenance.score_files.baseline): a cache restored from a shared store cannot swap the baseline's scores",
    )

    @model_validator(mode="after")
    def _fraction_tasks(self) -> Policy:
        tasks = {r.task for r in self.rules if not isinstance(r, AgreementRule)}
        if self.sequential is not None and set(self.sequential.task_stable_fraction) - tasks:
            unknown = sorted(set(self.sequential.task_stable_fraction) - tasks)
            raise ValueError(
                f"sequential.task_stable_fraction names {', '.join(unknown)}, which no rule of this policy judges "
                f"(its rules judge {', '.join(sorted(tasks)) or 'no task'}); name a task of a rule, or drop the entry"
            )
        return self

    @model_validator(mode="after")
    def _distinct(self) -> Policy:
        """One rule per task and metric (per agreement metric): a second one, with another limit, was counted twice
        in Holm's correction, and a search's prefilter took the first one's limit alone."""
        seen: dict[tuple[str, str], int] = {}
        for i, r in enumerate(self.rules):
            key = ("agreement", r.agreement.value) if isinstance(r, AgreementRule) else (r.task, r.metric)
            if key in seen:
                raise ValueError(
                    f"rules {seen[key] + 1} and {i + 1} both judge {' '.join(key)}: keep one rule per task and "
                    "metric (the stricter limit)"
                )
            seen[key] = i
        return self

    def settings(self) -> dict[str, Any]:
        """The policy as it decides, as a verdict records it (provenance.policy_settings): every field, its rules'
        names (their labels) among them, but its name (the verdict's `policy`) and its suite's path (the verdict
        holds the suite's settings and golden set, wherever the file lies)."""
        return self.model_dump(mode="json", exclude={"name", "suite"})

    def agreement_limits(self) -> tuple[float | None, float | None]:
        """(the largest mean KL, the smallest top-1 agreement) the policy's agreement rules allow; None: no rule."""
        agree = [r for r in self.rules if isinstance(r, AgreementRule)]
        kl = next((r.max for r in agree if r.agreement.value == "kl"), None)
        top1 = next((r.min for r in agree if r.agreement.value == "top1"), None)
        return kl, top1

    def label(self, i: int) -> str:
        r = self.rules[i]
        if r.name:
            return r.name
        if isinstance(r, AgreementRule):
            return f"agreement {r.agreement.value}"
        return f"{r.task} {r.metric}"


def load_policy(path: str | Path) -> Policy:
    policy, _ = load_yaml(
        path,
        Policy,
        "gate policy",
        "the shipped policies are in gates/*.yaml",
        Wording(skip_locs=frozenset({"accuracy", "perplexity", "agreement"}), tag_label="an {} rule"),
    )
    if policy.name is None:
        policy.name = Path(path).stem
    policy.suite = beside_repo(path, policy.suite)
    return policy
