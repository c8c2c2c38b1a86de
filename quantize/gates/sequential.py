"""A gate in stages: baseline-informed samples of each task, tested after each stage, stopped once settled.

The baseline is scored on every item once (cached); its per-item log-likelihoods say which items can flip.
An item is "stable" when the baseline's answer wins or loses by at least τ nats (`stable_margin`):

    multiple choice         margin = ll(gold) − max_{j ≠ gold} ll(j);     stable when |margin| ≥ τ
    greedy continuation     logit = ll − log(1 − e^ll)  (log-odds of the target's probability p = e^ll);
                            stable when right and logit ≥ τ, or wrong and logit ≤ −τ
    documents, generation   one stratum ("all"): no margin to read

Within each task, stratum h holds N_h items in a seeded random order; look k (fraction t_k of the schedule)
scores the first n_h,k = max(min(2, N_h), ⌈t_k · f_h · N_h⌉) of them, with f_h = 1 for at-risk items and
the task's stable fraction (`stable_fraction`, or its `task_stable_fraction` entry) for stable ones. Items
are drawn at random within strata with known inclusion shares n_h/N_h, so the design-weighted
Δ̂ = Σ_h (N_h/N) mean_h(D) is unbiased for the golden set's mean difference whatever the candidate
does (quantize/stats.py `stratified`); the strata only decide where the items are spent.

Every rule is tested at each look with the boundary c_k of a Lan–DeMets O'Brien–Fleming alpha-spending design
(`stats.sequential_bounds`), for both of its one-sided tests (pass and regression). A rule is frozen at the look
that decides it, and its task is no longer scored once every rule on it is decided; the gate stops at the first
regression or when every rule has passed.

Agreement rules are decided before the first look. Given one agreement result (measured once, on every agreement
item) they are tested once at level α. Given a staged agreement (`agree(k)`: the agreement on the first
⌈t_k · per_task⌉ agreement items of each task), they run looks of their own on the same schedule and boundaries:
at agreement look k every open agreement rule is tested at c_k, a decided rule is frozen, and the agreement looks
stop at a regression or once every agreement rule is decided (at the last look, whatever the result). An agreement
regression stops the gate before any item is scored: an agreement rule still open then keeps that look's
(inconclusive) result, and the score rules are recorded as untested.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from quantize import stats
from quantize.gates.gate import Look, agreement_rule, check_provenance, rule_result
from quantize.gates.policy import AgreementRule, Policy, Sequential
from quantize.kinds import kind_of_item
from quantize.records import (
    AgreementResult,
    RuleResult,
    ScoreDoc,
    SequentialRecord,
    UntestedResult,
)

STABLE, AT_RISK, ALL = "stable", "at-risk", "all"


def stratum(item: object, tau: float) -> str:
    """The stratum of a baseline item (module docstring); τ = 0 puts every item in one stratum."""
    kind = kind_of_item(item)
    margin = kind.margin(item) if tau > 0 and kind is not None else None
    if margin is None:
        return ALL
    return STABLE if margin >= tau else AT_RISK


@dataclass(frozen=True)
class TaskPlan:
    strata: dict[str, str]  # item id -> stratum
    population: dict[str, int]  # stratum -> items in the golden set
    draws: list[list[str]]  # per look: every item id scored by then (cumulative)


def draws(seq: Sequential, strata: dict[str, str], key: str, fraction: float) -> list[list[str]]:
    """The item ids each look has scored (cumulative), from every item's stratum: a seeded order within each
    stratum (`key` seeds it), the first n_h,k of it at look k, `fraction` of the stable items by the last look
    (module docstring)."""
    members: dict[str, list[str]] = {}
    for i, h in strata.items():
        members.setdefault(h, []).append(i)
    for h, ids in members.items():
        random.Random(f"{key}:{h}").shuffle(ids)
    out = []
    for t in seq.looks:
        ids: list[str] = []
        for h, hs in sorted(members.items()):
            f = fraction if h == STABLE else 1.0
            ids += hs[: max(min(2, len(hs)), math.ceil(t * f * len(hs) - 1e-9))]
        out.append(ids)
    return out


def plan(seq: Sequential, base: ScoreDoc, tasks: list[str], seed: int) -> dict[str, TaskPlan]:
    """Which candidate items each look scores, per task, from the baseline's scores (module docstring)."""
    plans = {}
    for task in tasks:
        strata = {i.id: stratum(i, seq.stable_margin) for i in base.tasks[task].items}
        population: dict[str, int] = {}
        for h in strata.values():
            population[h] = population.get(h, 0) + 1
        plans[task] = TaskPlan(strata, population, draws(seq, strata, f"{seed}:{task}", seq.fraction(task)))
    return plans


def look(plans: dict[str, TaskPlan], k: int, bounds: list[float]) -> Look:
    """Look k (0-based) of the schedule."""
    return Look(
        index=k + 1,
        bound=bounds[k],
        strata={t: p.strata for t, p in plans.items()},
        population={t: p.population for t, p in plans.items()},
    )


def rule_tasks(policy: Policy) -> list[str]:
    """The tasks the policy's score rules read, in rule order."""
    out: list[str] = []
    for r in policy.rules:
        if not isinstance(r, AgreementRule) and r.task not in out:
            out.append(r.task)
    return out


def open_tasks(policy: Policy, decided: dict[int, RuleResult]) -> list[str]:
    """Tasks with a rule not yet decided: the ones the next look scores."""
    out: list[str] = []
    for i, r in enumerate(policy.rules):
        if i not in decided and not isinstance(r, AgreementRule) and r.task not in out:
            out.append(r.task)
    return out


def step(
    policy: Policy,
    base: ScoreDoc,
    cand: ScoreDoc,
    at: Look,
    last: bool,
    decided: dict[int, RuleResult],
    latest: dict[int, RuleResult],
) -> None:
    """Test every open score rule at this look: a pass or regression (or any result at the last look) freezes it;
    `latest` keeps the newest result of every rule."""
    for i, r in enumerate(policy.rules):
        if i in decided or isinstance(r, AgreementRule):
            continue
        if r.task not in cand.tasks:
            continue
        res = rule_result(policy, i, base, cand, None, at)
        latest[i] = res
        if res.verdict != "inconclusive" or last:
            decided[i] = res


Agree = Callable[[int], AgreementResult]  # look k (0-based) -> the agreement on that look's share of the items


def agreement_first(
    policy: Policy, agreement: AgreementResult | Agree | None, bounds: list[float]
) -> tuple[dict[int, RuleResult], int | None]:
    """The agreement rules' results, before the first look (module docstring), and the agreement looks taken (None:
    measured once, on every agreement item)."""
    rules = {i: r for i, r in enumerate(policy.rules) if isinstance(r, AgreementRule)}
    out: dict[int, RuleResult] = {}
    if not rules:
        return out, None
    assert agreement is not None, "agreement rules need the agreement scores"
    if isinstance(agreement, AgreementResult):
        for i, r in rules.items():
            out[i] = agreement_rule(r, policy.label(i), agreement, policy.alpha)
        return out, None
    last = len(bounds) - 1
    for k in range(len(bounds)):
        measured = agreement(k)
        at = Look(index=k + 1, bound=bounds[k], strata={}, population={})
        latest: dict[int, RuleResult] = {}
        for i, r in rules.items():
            if i in out:
                continue
            latest[i] = agreement_rule(r, policy.label(i), measured, policy.alpha, at)
            if latest[i].verdict != "inconclusive" or k == last:
                out[i] = latest[i]
        if any(r.verdict == "regression" for r in out.values()):
            return out | latest, k + 1  # a rule still open keeps this look's (inconclusive) result
        if len(out) == len(rules):
            return out, k + 1
    raise AssertionError("the last agreement look decides every agreement rule")


def untested(policy: Policy, decided: dict[int, RuleResult]) -> list[RuleResult]:
    """Every rule's result when agreement alone settled the gate: the score rules were never tested."""
    why = "not scored: the gate stopped before the first look at the regression on " + ", ".join(
        r.rule for r in decided.values() if r.verdict == "regression"
    )
    return [  # every agreement rule has a result (agreement_first); the rest are score rules
        decided.get(i) or UntestedResult(rule=policy.label(i), task=r.task, reason=why)
        for i, r in enumerate(policy.rules)
    ]


def settled(policy: Policy, decided: dict[int, RuleResult]) -> bool:
    """The verdict cannot change: a rule found a regression, or every rule is decided."""
    return any(r.verdict == "regression" for r in decided.values()) or len(decided) == len(policy.rules)


def record(
    seq: Sequential,
    bounds: list[float],
    looks_taken: int,
    plans: dict[str, TaskPlan],
    scored: dict[str, int],
    seconds: float | None,
    agreement_looks: int | None = None,
) -> SequentialRecord:
    return SequentialRecord(
        agreement_looks_taken=agreement_looks,
        looks=seq.looks,
        bounds=bounds,
        stable_margin=seq.stable_margin,
        stable_fraction=seq.stable_fraction,
        task_stable_fraction=seq.task_stable_fraction,
        looks_taken=looks_taken,
        items_scored={t: scored.get(t, 0) for t in plans},
        items_total={t: sum(p.population.values()) for t, p in plans.items()},
        strata={t: dict(sorted(p.population.items())) for t, p in plans.items()},
        candidate_seconds=seconds,
    )


def _only(doc: ScoreDoc, tasks: dict) -> ScoreDoc:
    """The document with its provenance's task versions restricted to `tasks`."""
    versions = {t: v for t, v in doc.provenance.task_versions.items() if t in tasks}
    return doc.model_copy(update={"provenance": doc.provenance.model_copy(update={"task_versions": versions})})


def run(
    policy: Policy,
    base: ScoreDoc,
    agreement: AgreementResult | Agree | None,
    score: Callable[[dict[str, list[str]]], ScoreDoc],
    across_engines: bool = False,
) -> tuple[list[RuleResult], int, dict[str, TaskPlan], list[float], ScoreDoc | None, int | None]:
    """The sequential design end to end over a scorer: `score(ids per task)` returns the candidate's items
    scored so far for those tasks (quantize/evaluate/score.py `Staged`, or a score file's items); `agreement`: one
    result, or a staged agreement `agree(k)` (quantize/evaluate/agreement.py `StagedAgreement`). Returns the rules'
    results in policy order, the looks taken, the plans, the boundaries, the last candidate sample (None and 0 looks
    when an agreement regression stopped the gate before the first) and the agreement looks taken (None: one
    result). `across_engines`: gate.check_provenance's."""
    seq = policy.sequential
    assert seq is not None, "a sequential gate needs the policy's `sequential:` section"
    bounds = stats.sequential_bounds(seq.looks, policy.alpha)
    plans = plan(seq, base, rule_tasks(policy), base.provenance.seed)
    decided, agreement_looks = agreement_first(policy, agreement, bounds)
    latest = dict(decided)
    if settled(policy, decided):
        return untested(policy, decided), 0, plans, bounds, None, agreement_looks
    k = 0
    for k in range(len(seq.looks)):
        cand = score({t: plans[t].draws[k] for t in open_tasks(policy, decided)})
        # the sample covers the rules' tasks: their versions must match (a full score file has more), and each
        # look's new items their baseline's tokens
        check_provenance(
            _only(base, cand.tasks), _only(cand, cand.tasks), across_engines, policy.allow_different_tokenizer
        )
        step(policy, base, cand, look(plans, k, bounds), k == len(seq.looks) - 1, decided, latest)
        if settled(policy, decided):
            break
    return [decided.get(i) or latest[i] for i in range(len(policy.rules))], k + 1, plans, bounds, cand, agreement_looks
