"""The sequential gate: group-sequential boundaries against published values and a simulation, the stratified
estimator against a hand-worked example and against the fixed design, the item plan, and whole gates on
synthetic per-item results (A/A passes, a planted drop is rejected before the last look, a look schedule
that cannot work is exit 2), then staged scoring on a tiny model."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from quantize import stats
from quantize.cli import main
from quantize.gates import sequential as sq
from quantize.gates.gate import decide, side, verdict_of
from quantize.gates.policy import load_policy
from quantize.records import AgreementResult, ChoiceItem, GreedyItem, ScoreDoc, Verdict, parse

from conftest import result


@pytest.mark.parametrize(
    "looks,alpha,expected",
    [
        ([1.0], 0.05, [1.6449]),
        # Lan–DeMets O'Brien–Fleming spending, two-sided 0.05 (one-sided 0.025): Jennison & Turnbull (2000),
        # Table 7.6 / gsDesign's sfLDOF bounds
        ([0.5, 1.0], 0.025, [2.9626, 1.9686]),
        ([0.2, 0.4, 0.6, 0.8, 1.0], 0.025, [4.8769, 3.3569, 2.6803, 2.2898, 2.0310]),
    ],
)
def test_boundaries_match_published_values(looks, alpha, expected):
    assert stats.sequential_bounds(looks, alpha) == pytest.approx(expected, abs=2e-3)


def test_boundaries_spend_alpha_under_the_null_by_simulation():
    """Brownian motion under H0 observed at the looks crosses some c_k with probability α, and first at look k
    with probability α(t_k) − α(t_{k−1})."""
    looks, alpha = [0.2, 0.5, 1.0], 0.05
    c = np.asarray(stats.sequential_bounds(looks, alpha))
    rng = np.random.default_rng(0)
    t = np.asarray(looks)
    steps = rng.standard_normal((400_000, 3)) * np.sqrt(np.diff(np.concatenate([[0], t])))
    z = np.cumsum(steps, axis=1) / np.sqrt(t)
    crossed = z >= c
    first = np.where(crossed.any(1), crossed.argmax(1), -1)
    assert crossed.any(1).mean() == pytest.approx(alpha, abs=3 * math.sqrt(alpha / 400_000))
    spent = [stats.obf_spending(x, alpha) for x in looks]
    for k in range(3):
        assert (first == k).mean() == pytest.approx(spent[k] - (spent[k - 1] if k else 0), abs=1.5e-3)


def test_spending_is_increasing_and_spends_alpha_by_the_end():
    a = [stats.obf_spending(t, 0.05) for t in (0.1, 0.3, 0.6, 1.0)]
    assert a == sorted(a) and a[-1] == pytest.approx(0.05) and a[0] < 1e-5


def test_stratified_estimator_hand_example():
    # strata a (N=10): D = -1, 0 -> mean -1/2; b (N=30): D = 0, 0, 1 -> mean 1/3; Δ̂ = 1/4·(-1/2) + 3/4·(1/3) = 1/8
    # Agresti–Min per stratum: a: b=1, c=0, n=2 -> √(2 − 1/4)/4; b: b=0, c=1, n=3 -> √(2 − 1/5)/5
    d, strata = [-1, 0, 0, 0, 1], ["a", "a", "b", "b", "b"]
    mean, _, _, se = stats.stratified(d, [str(i) for i in range(5)], strata, {"a": 10, "b": 30})
    se_a, se_b = math.sqrt(1.75) / 4, math.sqrt(1.8) / 5
    assert mean == pytest.approx(1 / 8)
    assert se == pytest.approx(math.sqrt((0.25 * se_a) ** 2 + (0.75 * se_b) ** 2))


def test_one_stratum_every_item_one_look_is_the_fixed_design():
    rng = random.Random(3)
    d = [rng.choice([-1, 0, 0, 0, 0, 1]) for _ in range(400)]
    clusters = [f"c{i % 37}" for i in range(400)]
    fixed = stats.noninferiority(d, clusters, 0.02, 0.05, 0.8)
    one = stats.noninferiority(
        d, clusters, 0.02, 0.05, 0.8, ["all"] * 400, {"all": 400}, bound=stats.sequential_bounds([1.0], 0.05)[0]
    )
    assert (one.delta, one.se, one.lower, one.upper, one.verdict) == pytest.approx(
        (fixed.delta, fixed.se, fixed.lower, fixed.upper, fixed.verdict)
    )


def test_design_weighted_estimate_is_unbiased_whatever_the_candidate_does():
    """Stable items sampled at 20%, at-risk at 100%: the candidate here flips only stable items (the strata
    guessed wrong), and the average estimate is still the golden set's true Δ."""
    n_stable, n_risk = 800, 200
    d = [-1.0 if i % 10 == 0 else 0.0 for i in range(n_stable)] + [0.0] * n_risk  # Δ = -80/1000
    strata = ["stable"] * n_stable + ["risk"] * n_risk
    true = sum(d) / len(d)
    rng = random.Random(0)
    est = []
    for _ in range(3000):
        pick = rng.sample(range(n_stable), 160) + list(range(n_stable, n_stable + n_risk))
        est.append(
            stats.stratified(
                [d[i] for i in pick], [str(i) for i in pick], [strata[i] for i in pick], {"stable": 800, "risk": 200}
            )[0]
        )
    assert np.mean(est) == pytest.approx(true, abs=3 * np.std(est) / math.sqrt(len(est)))


def test_strata_from_the_baseline_margin():
    mc = dict(id="x", cluster="c", score=1.0)
    assert sq.stratum(ChoiceItem(**mc, ll=-1.0, lls=[-1.0, -4.0, -5.0]), 2.0) == sq.STABLE  # wins by 3 nats
    assert sq.stratum(ChoiceItem(**mc, ll=-1.0, lls=[-1.0, -1.5, -5.0]), 2.0) == sq.AT_RISK
    assert sq.stratum(ChoiceItem(id="x", cluster="c", score=0.0, ll=-6.0, lls=[-1.0, -6.0]), 2.0) == sq.STABLE
    # greedy: p = 0.95 right (logit 2.94) stable; p = 0.6 right at risk; p = 0.01 wrong stable; p = 0.3 wrong at risk
    g = [(0.95, 1.0, sq.STABLE), (0.6, 1.0, sq.AT_RISK), (0.01, 0.0, sq.STABLE), (0.3, 0.0, sq.AT_RISK)]
    for p, s, want in g:
        assert sq.stratum(GreedyItem(id="x", cluster="c", score=s, ll=math.log(p)), 2.0) == want
    assert sq.stratum(GreedyItem(id="x", cluster="c", score=1.0, ll=math.log(0.95)), 0.0) == sq.ALL


def _docs(n=3000, drop=0.0, seed=0, ppl_shift=0.0):
    """Baseline and candidate score files on a greedy task (varied baseline probabilities) and a prose task.
    `drop`: the share of all items turned from right to wrong, taken among the at-risk right items."""
    rng = random.Random(seed)
    ps = [rng.choice([0.97, 0.99, 0.6, 0.4, 0.02, 0.005]) for _ in range(n)]
    acc = [float(p > 0.5) for p in ps]
    prose = [-300.0 - 40 * rng.random() for _ in range(100)]
    base, cand = result(acc, prose), result(acc, [x - ppl_shift for x in prose], sha="b")
    for it, p in zip(base["tasks"]["t_acc"]["items"], ps, strict=True):
        it["ll"] = math.log(p)
    at_risk_right = [i for i, p in enumerate(ps) if p == 0.6]
    flips = rng.sample(at_risk_right, round(drop * n))
    # harmless noise: symmetric flips among at-risk items
    noise = rng.sample([i for i, p in enumerate(ps) if p in (0.6, 0.4) and i not in flips], 30)
    for i in flips + noise:
        cand["tasks"]["t_acc"]["items"][i]["score"] = 1.0 - acc[i]
    return parse(ScoreDoc, base, "b"), parse(ScoreDoc, cand, "c")


def _policy(tmp_path, looks="[0.2, 0.5, 1.0]", extra="", more_rules=""):
    p = tmp_path / "gates" / "seq.yaml"
    p.parent.mkdir(exist_ok=True)
    p.write_text(
        f"suite: evaluate/core.yaml\nsequential: {{looks: {looks}, stable_margin: 2.0, stable_fraction: 0.3{extra}}}\n"
        "rules:\n  - {task: t_acc, metric: acc, margin: 0.02}\n"
        "  - {task: t_prose, metric: perplexity, max_ratio: 1.05}\n" + more_rules
    )
    return load_policy(p)


def _from_file(cand: ScoreDoc, asked: list):
    """A scorer over a complete candidate: returns the asked items, and records what was asked."""

    def score(ids):
        asked.append({t: len(v) for t, v in ids.items()})
        want = {t: set(v) for t, v in ids.items()}
        tasks = {
            t: ts.model_copy(update={"items": [i for i in ts.items if i.id in want[t]]})
            for t, ts in cand.tasks.items()
            if t in want
        }
        return cand.model_copy(update={"tasks": tasks})

    return score


def test_a_a_passes_and_spends_fewer_items(tmp_path):
    policy = _policy(tmp_path)
    base, cand = _docs()
    asked: list = []
    results, _, plans, _, _, _ = sq.run(policy, base, None, _from_file(cand, asked))
    assert [r.verdict for r in results] == ["pass", "pass"]
    assert max(a.get("t_acc", 0) for a in asked) < 0.6 * 3000  # stable items (two thirds here) drawn at 30%
    assert plans["t_acc"].population == {"at-risk": pytest.approx(1000, abs=80), "stable": pytest.approx(2000, abs=80)}


def test_planted_drop_is_rejected_before_the_last_look(tmp_path):
    policy = _policy(tmp_path)
    base, cand = _docs(drop=0.06)
    asked: list = []
    results, taken, _, _, _, _ = sq.run(policy, base, None, _from_file(cand, asked))
    assert results[0].verdict == "regression" and taken < 3 and results[0].look == taken
    fixed = decide(policy, base, cand, None)
    assert fixed.rules[0].verdict == "regression"  # the full design agrees


def test_a_rule_decided_early_stops_its_task(tmp_path):
    """Perplexity far past its limit is decided at look 1; the accuracy rule keeps going, prose is not scored again."""
    policy = _policy(tmp_path)
    base, cand = _docs(ppl_shift=-50.0)  # the candidate's documents are far more likely: ratio far below 1.05
    asked: list = []
    results, _, _, _, _, _ = sq.run(policy, base, None, _from_file(cand, asked))
    assert results[1].verdict == "pass" and results[1].look == 1
    assert all("t_prose" not in a for a in asked[1:])


def test_sequential_verdict_records_the_design(tmp_path):
    policy = _policy(tmp_path)
    base, cand = _docs(drop=0.06)
    results, taken, plans, bounds, _, _ = sq.run(policy, base, None, _from_file(cand, []))
    rec = sq.record(policy.sequential, bounds, taken, plans, {"t_acc": 10, "t_prose": 5}, 1.5)
    v = verdict_of(policy, base, side(cand), results, rec)
    assert v.verdict == "rejected" and v.sequential.looks_taken == taken and v.sequential.bounds == bounds
    from quantize.gates.render import render_text

    assert f"{taken} of 3 looks" in render_text(v)


def test_a_task_stable_fraction_draws_that_tasks_stable_items(tmp_path):
    """task_stable_fraction 1.0: by the last look every item of that task is scored (the fixed design's sample),
    while the default fraction still samples the stable items of the others."""
    base, _ = _docs()
    full = _policy(tmp_path, extra=", task_stable_fraction: {t_acc: 1.0}")
    half = _policy(tmp_path)
    assert full.sequential.fraction("t_acc") == 1.0 and full.sequential.fraction("t_prose") == 0.3
    p_full = sq.plan(full.sequential, base, ["t_acc"], 0)["t_acc"]
    p_half = sq.plan(half.sequential, base, ["t_acc"], 0)["t_acc"]
    assert sorted(p_full.draws[-1]) == sorted(i.id for i in base.tasks["t_acc"].items)
    stable = [i for i, h in p_half.strata.items() if h == sq.STABLE]
    assert len([i for i in p_half.draws[-1] if p_half.strata[i] == sq.STABLE]) == math.ceil(0.3 * len(stable))
    # each look's sample is the one before it and more
    for a, b in zip(p_full.draws, p_full.draws[1:], strict=False):
        assert set(a) < set(b)


def test_a_task_stable_fraction_for_a_task_no_rule_judges_is_exit_2(tmp_path, capsys):
    p = tmp_path / "p.yaml"
    p.write_text(
        "suite: evaluate/core.yaml\nsequential: {task_stable_fraction: {core_kv: 1.0}}\n"
        "rules:\n  - {task: core_facts, margin: 0.02}\n"
    )
    code = main(["gate", str(p), "--baseline", str(tmp_path), "--candidate", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "task_stable_fraction" in err and "core_kv" in err and "Traceback" not in err


def _agreement(kl: float) -> AgreementResult:
    return AgreementResult(
        positions=4000, items=200, clusters=200, kl_mean=kl, kl_se=0.01, kl_p99=3 * kl, top1=0.9, top1_se=0.01,
        sum_min=0.9, sum_min_se=0.01, note="test", baseline_identity="b", candidate_identity="c", top_k=20,
        per_task=50, tasks=["t_acc"],
    )  # fmt: skip


def test_an_agreement_regression_stops_before_any_item_is_scored(tmp_path):
    """Agreement is measured before the first look; a regression there settles the gate: nothing is scored,
    the score rules are recorded as untested, and the verdict (rejected) is the fixed design's."""
    from quantize.gates.render import render_junit, render_text

    policy = _policy(tmp_path, more_rules="  - {agreement: kl, max: 0.2}\n")
    base, cand = _docs()
    asked: list = []
    results, taken, plans, bounds, last, _ = sq.run(policy, base, _agreement(1.5), _from_file(cand, asked))
    assert asked == [] and taken == 0 and last is None
    assert [r.verdict for r in results] == ["untested", "untested", "regression"]
    assert "agreement kl" in results[0].reason
    rec = sq.record(policy.sequential, bounds, taken, plans, {}, None)
    v = verdict_of(policy, base, side(base), results, rec)
    assert v.verdict == "rejected" and v.exit_code == 1
    assert v.verdict == decide(policy, base, cand, _agreement(1.5)).verdict
    assert parse(Verdict, v.model_dump(mode="json"), "verdict") == v  # the record round-trips
    text = render_text(v)
    assert "stopped before the first look" in text and "[    UNTESTED] t_acc acc" in text
    assert render_junit(v).count("<skipped") == 2
    # agreement within its limit: the looks run as before
    asked = []
    results, taken, *_ = sq.run(policy, base, _agreement(0.01), _from_file(cand, asked))
    assert asked and taken >= 1 and results[2].verdict == "pass" and results[2].look is None


def _staged(values: list[float], asked: list[int]):
    """A staged agreement whose KL at look k is values[k], with a clustered SE that shrinks as the looks grow
    (0.02 at look 1, as 1/√t); `asked` records the looks measured."""
    looks = [0.2, 0.5, 1.0]

    def agree(k: int) -> AgreementResult:
        asked.append(k)
        return _agreement(values[k]).model_copy(update={"kl_se": 0.02 * (looks[0] / looks[k]) ** 0.5, "per_task": k})

    return agree


@pytest.mark.parametrize(
    "kls,looks_taken,verdict",
    [
        ([1.5, 9.0, 9.0], 1, "regression"),  # far past the limit: the first agreement look decides, nothing else runs
        ([0.01, 9.0, 9.0], 1, "pass"),  # far within it: decided at the first look, frozen (9.0 is never seen)
        ([0.25, 0.24, 9.0], 2, "regression"),  # nearer: c_1 = 4.23 leaves it open, c_2 = 2.54 decides it
        ([0.25, 0.21, 0.205], 3, "inconclusive"),  # at the limit: the last look's result, whatever it is
    ],
)
def test_staged_agreement_runs_looks_of_its_own_at_the_looks_bounds(tmp_path, kls, looks_taken, verdict):
    """Agreement rules in stages: at agreement look k the rule is tested at c_k, a decided rule is frozen, and the
    agreement looks stop once every agreement rule is decided; a regression stops the gate before any item."""
    policy = _policy(tmp_path, more_rules="  - {agreement: kl, max: 0.2}\n")
    base, cand = _docs()
    asked_items: list = []
    looks: list[int] = []
    results, taken, _, bounds, _, agreement_looks = sq.run(
        policy, base, _staged(kls, looks), _from_file(cand, asked_items)
    )
    assert looks == list(range(looks_taken)) and agreement_looks == looks_taken
    kl = results[2]
    assert kl.verdict == verdict and kl.look == looks_taken
    e = kl.evidence
    assert e.lower_bound == pytest.approx(e.value - bounds[looks_taken - 1] * e.se_clustered)  # c_k, not z₁₋α
    if verdict == "regression":
        assert asked_items == [] and taken == 0 and [r.verdict for r in results[:2]] == ["untested", "untested"]
    else:
        assert asked_items and taken >= 1


def test_every_agreement_rule_must_be_decided_before_the_looks_stop(tmp_path):
    """Two agreement rules: KL passes at the first look, top-1 needs the second; KL keeps its first-look result."""
    policy = _policy(tmp_path, more_rules="  - {agreement: kl, max: 0.2}\n  - {agreement: top1, min: 0.85}\n")
    base, cand = _docs()
    looks: list[int] = []

    def agree(k: int) -> AgreementResult:
        looks.append(k)
        return _agreement([0.01, 0.01, 0.01][k]).model_copy(update={"top1": [0.87, 0.95, 0.95][k], "per_task": k})

    results, _, _, _, _, agreement_looks = sq.run(policy, base, agree, _from_file(cand, []))
    assert looks == [0, 1] and agreement_looks == 2
    assert (results[2].verdict, results[2].look) == ("pass", 1)
    assert (results[3].verdict, results[3].look) == ("pass", 2)
    from quantize.gates.render import render_text

    results, taken, plans, bounds, _, agreement_looks = sq.run(policy, base, agree, _from_file(cand, []))
    rec = sq.record(policy.sequential, bounds, taken, plans, {}, None, agreement_looks)
    text = render_text(verdict_of(policy, base, side(cand), results, rec))
    assert "after 2 agreement looks" in text and "agreement top1  (agreement look 2)" in text
    assert f"(critical value {bounds[1]:.3f}) vs min 0.85" in text


def test_an_agreement_rule_still_open_at_an_agreement_regression_keeps_that_looks_result(tmp_path):
    """KL regresses at the first agreement look while top-1 sits at its limit (inconclusive at c_1): the gate stops
    there, top-1 is recorded as inconclusive at look 1 (never as untested, and never re-measured), the score rules
    as untested, and the verdict renders and round-trips (found by `make demo`: GPTQ W4A16 on an AMX host)."""
    from quantize.gates.render import render_junit, render_text

    policy = _policy(tmp_path, more_rules="  - {agreement: kl, max: 0.2}\n  - {agreement: top1, min: 0.70}\n")
    base, cand = _docs()
    looks: list[int] = []

    def agree(k: int) -> AgreementResult:
        looks.append(k)
        return _agreement(1.5).model_copy(update={"top1": 0.69, "top1_se": 0.01, "per_task": k})

    asked: list = []
    results, taken, plans, bounds, last, agreement_looks = sq.run(policy, base, agree, _from_file(cand, asked))
    assert looks == [0] and agreement_looks == 1 and asked == [] and taken == 0 and last is None
    assert [r.verdict for r in results] == ["untested", "untested", "regression", "inconclusive"]
    assert results[3].look == 1 and results[3].evidence.value == pytest.approx(0.69)
    rec = sq.record(policy.sequential, bounds, taken, plans, {}, None, agreement_looks)
    v = verdict_of(policy, base, side(cand), results, rec)
    assert v.verdict == "rejected" and v.exit_code == 1
    assert parse(Verdict, v.model_dump(mode="json"), "verdict") == v
    assert "agreement top1" in render_text(v) and render_junit(v).count("<skipped") == 2


@pytest.mark.parametrize(
    "looks,why",
    [("[0.5, 0.3, 1.0]", "not a look schedule"), ("[0.2, 0.5]", "must be 1"), ("[0, 1.0]", "not a look schedule")],
)
def test_impossible_look_schedule_is_exit_2(tmp_path, capsys, looks, why):
    p = tmp_path / "p.yaml"
    p.write_text(
        f"suite: evaluate/core.yaml\nsequential: {{looks: {looks}}}\nrules:\n  - {{task: core_facts, margin: 0.02}}\n"
    )
    code = main(["gate", str(p), "--baseline", str(tmp_path), "--candidate", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "sequential.looks" in err and why in err and "Traceback" not in err


def test_a_sample_of_another_task_version_is_refused(tmp_path):
    from quantize.errors import UsageError

    policy = _policy(tmp_path)
    base, cand = _docs()
    prov = cand.provenance.model_copy(update={"task_versions": {"t_acc": 2.0, "t_prose": 1.0}})
    with pytest.raises(UsageError, match="task_versions"):
        sq.run(policy, base, None, _from_file(cand.model_copy(update={"provenance": prov}), []))


def test_each_looks_items_are_held_to_their_baselines_tokens(tmp_path):
    """The token hashes of a baseline's score file are compared with every look's items, not the first look's alone:
    an item drawn first at look 2 and scored on other tokens is exit 2 there."""
    from quantize.errors import UsageError

    policy = _policy(tmp_path)
    base, cand = _docs()
    for doc in (base, cand):
        for t in doc.tasks.values():
            for i in t.items:
                i.tokens_sha256 = f"{i.id:0>64}"
    draws = sq.plan(policy.sequential, base, sq.rule_tasks(policy), base.provenance.seed)["t_acc"].draws
    late = sorted(set(draws[1]) - set(draws[0]))[0]
    next(i for i in cand.tasks["t_acc"].items if i.id == late).tokens_sha256 = "f" * 64
    asked: list = []
    with pytest.raises(UsageError, match=f"scored on other tokens for 1 item.s. .t_acc: {late};"):
        sq.run(policy, base, None, _from_file(cand, asked))
    assert len(asked) == 2  # found at the look that drew it
