"""Gate policies (gates/*.yaml): which rules a candidate must pass against its baseline."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from quantize.errors import UsageError


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None


class AccuracyRule(_Rule):
    """Non-inferiority of an accuracy-like metric: pass when Δ − z·SE > −margin."""

    task: str
    metric: Literal["acc"] = "acc"
    margin: float = Field(gt=0, lt=1, description="absolute drop tolerated, e.g. 0.02 = two points")


class PerplexityRule(_Rule):
    """Perplexity ratio candidate/baseline from paired per-document log-likelihoods (cluster bootstrap)."""

    task: str
    metric: Literal["perplexity"] = "perplexity"
    max_ratio: float = Field(gt=1, description="e.g. 1.05: at most 5% higher perplexity")


class AgreementMetric(str, Enum):
    kl = "kl"  # mean KL(baseline ‖ candidate), top-k lower bound
    top1 = "top1"  # share of positions with the same most likely token
    sum_min = "sum_min"  # Σ min(p, q): acceptance rate as a draft for the baseline


class AgreementRule(_Rule):
    """A tolerance on token-distribution agreement: the confidence bound must sit inside the limit."""

    agreement: AgreementMetric
    max: float | None = Field(None, gt=0)
    min: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _limit(self) -> "AgreementRule":
        if self.agreement is AgreementMetric.kl and (self.max is None or self.min is not None):
            raise ValueError("an agreement: kl rule takes `max:` (the largest mean KL tolerated) and no `min:`")
        if self.agreement is not AgreementMetric.kl and (self.min is None or self.max is not None):
            raise ValueError(f"an agreement: {self.agreement.value} rule takes `min:` (the smallest value tolerated) and no `max:`")
        return self


def _kind(v: object) -> str:
    if isinstance(v, dict):
        if "agreement" in v:
            return "agreement"
        return "perplexity" if v.get("metric") == "perplexity" else "accuracy"
    return {AccuracyRule: "accuracy", PerplexityRule: "perplexity", AgreementRule: "agreement"}[type(v)]


Rule = Annotated[
    Annotated[AccuracyRule, Tag("accuracy")] | Annotated[PerplexityRule, Tag("perplexity")] | Annotated[AgreementRule, Tag("agreement")],
    Discriminator(_kind),
]


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    suite: str = Field(description="evaluation suite the scores come from, e.g. evaluate/core.yaml")
    alpha: float = Field(0.05, gt=0, lt=0.5, description="one-sided level of every bound")
    power: float = Field(0.8, gt=0.5, lt=1, description="power used for 'items needed' and the detectable effect")
    fail_on_inconclusive: bool = True
    rules: list[Rule] = Field(min_length=1)

    def label(self, i: int) -> str:
        r = self.rules[i]
        if r.name:
            return r.name
        if isinstance(r, AgreementRule):
            return f"agreement {r.agreement.value}"
        return f"{r.task} {r.metric}"


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"gate policy {p} does not exist; the shipped policies are in gates/*.yaml")
    try:
        data = yaml.safe_load(p.read_bytes())
    except yaml.YAMLError as e:
        raise UsageError(f"{p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{p}: a policy is a YAML mapping, got {type(data).__name__}")
    try:
        policy = Policy.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            field = ".".join(str(x) for x in err["loc"] if not str(x) in ("accuracy", "perplexity", "agreement")) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"unknown key `{field}`" if err["type"] == "extra_forbidden" else f"{field}: {msg}")
        raise UsageError(f"{p} is not a valid gate policy:\n" + "\n".join(f"  - {x}" for x in lines)) from None
    if policy.name is None:
        policy.name = p.stem
    suite = Path(policy.suite)
    if not suite.is_absolute() and not suite.exists():
        policy.suite = str(p.resolve().parent.parent / policy.suite)
    return policy
