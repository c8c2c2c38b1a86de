"""The gate's statistics against independent computations (scipy, hand-worked examples)."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats as sps

from quantize import stats


def test_paired_se_matches_scipy_sem():
    rng = random.Random(0)
    d = [rng.choice([-1, 0, 0, 0, 1]) for _ in range(200)]
    assert stats.paired_se(d) == pytest.approx(float(sps.sem(d)))


def test_clustered_se_hand_example():
    # D = [1, 0, -1, 0, 1, 1], clusters a a b b c c; Δ = 1/3
    # cluster sums of (D - Δ): a: 1/3, b: -5/3, c: 4/3 -> Σ² = (1 + 25 + 16)/9 = 42/9
    # SE² = G/(G-1) · Σ² / n² = 3/2 · (42/9) / 36
    d, c = [1, 0, -1, 0, 1, 1], list("aabbcc")
    assert stats.clustered_se(d, c) == pytest.approx(math.sqrt(1.5 * (42 / 9) / 36))


def test_clustered_equals_plain_scaled_when_each_item_is_its_own_cluster():
    rng = random.Random(1)
    d = [rng.gauss(0, 1) for _ in range(50)]
    # with singleton clusters CR1 = sqrt(n/(n-1) · Σ(D-Δ)²/n²) = sqrt(var/n) = sem
    assert stats.clustered_se(d, [str(i) for i in range(50)]) == pytest.approx(float(sps.sem(d)))


@pytest.mark.parametrize("b,c", [(0, 0), (3, 0), (10, 4), (25, 30), (100, 70)])
def test_mcnemar_exact_matches_binomtest(b, c):
    expected = 1.0 if b + c == 0 else sps.binomtest(b, b + c, 0.5).pvalue
    assert stats.mcnemar_exact(b, c) == pytest.approx(expected)


def test_holm_hand_example():
    # sorted: 0.01·3 = 0.03; 0.03·2 = 0.06; 0.04·1 = 0.04 -> monotone 0.06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_drop_p_is_the_one_sided_normal_p_and_agrees_with_the_bound():
    assert stats.drop_p(-0.05, 0.02) == pytest.approx(float(sps.norm.cdf(-2.5)))
    assert stats.drop_p(0.0, 0.0) == 1.0 and stats.drop_p(-0.01, 0.0) == 0.0
    # upper bound Δ + z.95·SE < 0  <=>  p < 0.05
    for delta, se in [(-0.04, 0.02), (-0.03, 0.02), (-0.02, 0.02)]:
        assert (delta + stats.z(0.95) * se < 0) == (stats.drop_p(delta, se) < 0.05)


def test_n_required_formula():
    # (z.95 + z.8)² · f / m² with f = 0.1 (flip rate = var of D when Δ ≈ 0), m = 0.02
    f = 0.1
    assert stats.n_required(math.sqrt(f), 0.02, 0.05, 0.8) == math.ceil((1.6448536 + 0.8416212) ** 2 * f / 0.0004)


def test_n_required_is_inf_where_its_formula_gives_no_finite_number():
    """m² of 1e-300 underflows to 0 (ZeroDivisionError), z of 1 − 1e-300 is infinite (ceil of inf raised), a huge sd
    squares past the largest float (OverflowError): each is no number of items, as m ≤ 0 already was."""
    assert stats.n_required(0.5, 1e-300, 0.05, 0.8) == math.inf
    assert stats.n_required(0.5, 0.02, 1e-300, 0.8) == math.inf
    assert stats.n_required(1e200, 0.02, 0.05, 0.8) == math.inf
    assert stats.n_required(0.5, float("nan"), 0.05, 0.8) == math.inf
    m = 1e-9  # tiny but representable: still the formula's number
    assert stats.n_required(0.5, m, 0.05, 0.8) == math.ceil((stats.z(0.95) + stats.z(0.8)) ** 2 * 0.25 / m**2)
    r = stats.noninferiority([0.0] * 8 + [1.0, -1.0], [str(i) for i in range(10)], 1e-300, 0.05, 0.8)
    assert r.n_needed == math.inf and r.verdict == "inconclusive"


def test_noninferiority_pass_regression_inconclusive():
    rng = random.Random(2)
    same = [0.0] * 900 + [1.0] * 50 + [-1.0] * 50  # Δ = 0, 10% flips
    assert stats.noninferiority(same, [str(i) for i in range(1000)], 0.02, 0.05, 0.8).verdict == "pass"
    drop = [0.0] * 870 + [1.0] * 20 + [-1.0] * 110  # Δ = −0.09
    r = stats.noninferiority(drop, [str(i) for i in range(1000)], 0.02, 0.05, 0.8)
    assert r.verdict == "regression" and r.delta == pytest.approx(-0.09)
    small = [rng.choice([0.0, 0.0, 1.0, -1.0]) for _ in range(30)]
    r = stats.noninferiority(small, [str(i) for i in range(30)], 0.02, 0.05, 0.8)
    assert r.verdict == "inconclusive" and r.n_needed > 30


def test_items_needed_at_the_estimate_follows_the_observed_drop():
    # Δ = −0.01 with margin 0.03: the bound has to clear −0.03 from −0.01, so (z.95 + z.8)² σ² / 0.02² items
    d = [0.0] * 880 + [1.0] * 55 + [-1.0] * 65
    r = stats.noninferiority(d, [str(i) for i in range(1000)], 0.03, 0.05, 0.8)
    assert r.n_needed_at_estimate == stats.n_required(r.sd, 0.03 - 0.01, 0.05, 0.8) > r.n_needed
    past = stats.noninferiority([0.0] * 20 + [-1.0] * 2, [str(i) for i in range(22)], 0.05, 0.05, 0.8)
    assert past.delta < -0.05 and past.verdict == "inconclusive" and past.n_needed_at_estimate is None


def test_no_flips_in_few_items_is_not_certainty():
    r = stats.noninferiority([0.0] * 24, [str(i) for i in range(24)], 0.05, 0.05, 0.8)
    assert r.se == pytest.approx(1 / 26) and r.verdict == "inconclusive"
    r = stats.noninferiority([0.0] * 2000, [str(i) for i in range(2000)], 0.02, 0.05, 0.8)
    assert r.verdict == "pass"


def test_agresti_min_hand_example():
    # b = 3, c = 1, n = 20: cells + 0.5 -> b' = 3.5, c' = 1.5, n' = 22; var = (5 - (−2)²/22) / 22²
    assert stats.agresti_min_se(3, 1, 20) == pytest.approx(math.sqrt(5 - 4 / 22) / 22)


def test_wilson_bounds_hand_example():
    # 17 of 20 at q = 1.645: (0.85 + q²/40 ∓ q √(0.85·0.15/20 + q²/1600)) / (1 + q²/20)
    q = 1.645
    d = 1 + q * q / 20
    half = q / d * (0.85 * 0.15 / 20 + q * q / 1600) ** 0.5
    lo, hi = stats.wilson_bounds(0.85, 20, q)
    assert (lo, hi) == (pytest.approx((0.85 + q * q / 40) / d - half), pytest.approx((0.85 + q * q / 40) / d + half))
    assert stats.wilson_bounds(0.5, 0, q) == (0.0, 1.0)


def test_a_difference_past_a_floats_range_is_an_infinite_se_not_an_overflow():
    assert stats.paired_se([1e300, -1e300, 0.0]) == math.inf  # (x − x̄) ** 2 raised OverflowError: exit 3


def test_design_weights_make_a_stratified_sample_estimate_the_whole_sets_ratio():
    """Every item of a stratum of 100 (no change) and a third of one of 300 (0.1 nat worse each): the sample's
    ratio is exp(0.1 · 100 / 200); the set's, which N_h / n_h weights recover, exp(0.1 · 300 / 400)."""
    diffs = [0.0] * 100 + [0.1] * 100
    base = [1.0] * 200
    cand = [b + d for b, d in zip(base, diffs, strict=True)]
    clusters = [str(i) for i in range(200)]
    plain = stats.bootstrap_ppl_ratio(base, cand, [1.0] * 200, clusters, 0.05)[0]
    weights = stats.design_weights(["at_risk"] * 100 + ["stable"] * 100, {"at_risk": 100, "stable": 300})
    assert weights == [1.0] * 100 + [3.0] * 100  # N_h / n_h
    weighted = stats.bootstrap_ppl_ratio(base, cand, [1.0] * 200, clusters, 0.05, weights=weights)
    assert plain == pytest.approx(math.exp(0.05)) and weighted[0] == pytest.approx(math.exp(0.075))
    assert weighted[1] <= weighted[0] <= weighted[2]


def test_clustering_widens_the_interval():
    d = [-1.0, -1.0, -1.0, 0.0, 0.0, 0.0] * 20  # errors come in blocks of a cluster
    clusters = [f"c{i // 3}" for i in range(len(d))]
    r = stats.noninferiority(d, clusters, 0.02, 0.05, 0.8)
    assert r.se_clustered > r.se_paired and r.se == r.se_clustered


def test_bootstrap_ppl_ratio():
    base = [10.0 + i % 3 for i in range(60)]
    units = [5.0] * 60
    shifted = [b + 0.25 for b in base]  # +0.25 nats per 5 units on every document: ratio exp(0.05) everywhere
    point, lo, hi = stats.bootstrap_ppl_ratio(base, shifted, units, [str(i // 2) for i in range(60)], 0.05)
    assert point == pytest.approx(math.exp(0.05)) and lo == pytest.approx(point) and hi == pytest.approx(point)
    noisy = [b + (0.5 if i % 2 else -0.3) for i, b in enumerate(base)]
    point, lo, hi = stats.bootstrap_ppl_ratio(base, noisy, units, [str(i) for i in range(60)], 0.05)
    assert lo < point < hi and point == pytest.approx(math.exp((30 * 0.5 - 30 * 0.3) / 300))


def test_items_that_share_one_cluster_are_each_their_own():
    """One cluster leaves no between-cluster variance to estimate: the clustered SE was infinite, which made a task
    whose items all share one cluster a regression against itself (a review). Each item is then its own cluster:
    the paired SE, and the bootstrap resamples documents, so its bounds are not the point estimate twice."""
    rng = random.Random(3)
    d = [rng.gauss(0, 1) for _ in range(40)]
    assert stats.clustered_se(d, ["one"] * 40) == pytest.approx(stats.paired_se(d))
    base = [-300.0 - 40 * rng.random() for _ in range(20)]
    cand = [b + rng.gauss(0, 30) for b in base]
    point, lo, hi = stats.bootstrap_ppl_ratio(base, cand, [100.0] * 20, ["one"] * 20, 0.05)
    assert lo < point < hi
    assert (point, lo, hi) == stats.bootstrap_ppl_ratio(base, cand, [100.0] * 20, [str(i) for i in range(20)], 0.05)


def test_a_ratio_past_a_floats_range_is_infinite():
    """A candidate a million nats worse per unit (NLLs): an infinite ratio, without an overflow or a warning."""
    point, lo, hi = stats.bootstrap_ppl_ratio([1.0] * 10, [1e6] * 10, [1.0] * 10, [str(i) for i in range(10)], 0.05)
    assert point == lo == hi == math.inf


def test_early_looks_have_finite_boundaries_or_are_refused():
    """O'Brien-Fleming spends ~1e-18 at t = 0.05: 2 − 2Φ rounded it to 0 and c₁ was infinite (an agreement look
    then had infinite bounds: a regression before anything was scored); [0.01, 0.02, 1] stopped in brentq."""
    c = stats.sequential_bounds([0.05, 1.0], 0.05)
    assert all(math.isfinite(x) for x in c)
    assert c[0] == pytest.approx(float(sps.norm.isf(stats.obf_spending(0.05, 0.05))))
    assert stats.obf_spending(0.05, 0.05) > 0
    with pytest.raises(ValueError, match="look 2 at 0.02 spends"):
        stats.sequential_bounds([0.01, 0.02, 1.0], 0.05)


def test_a_level_the_resamples_cannot_resolve_keeps_its_critical_value():
    """A sequential first look's level (1.2e-5) from 2000 resamples was the resamples' extreme: an upper bound
    about 3.4 standard errors out where the look's critical value is 4.23, 33 times the alpha it spends (a
    review's simulation). The normal bound on the log ratio with the bootstrap's SD sits at the critical value."""
    import numpy as np

    c1 = stats.sequential_bounds([0.2, 0.5, 1.0], 0.05)[0]
    level = float(sps.norm.sf(c1))
    rng = np.random.default_rng(1)
    zs = []
    for _ in range(40):
        base = 300 + 40 * rng.random(40)
        cand = base + math.log(1.05) * 100 + rng.normal(0, 3.0, 40)
        docs = [str(i) for i in range(40)]
        point, _, hi = stats.bootstrap_ppl_ratio(list(base), list(cand), [100.0] * 40, docs, level)
        se_log = np.std(cand - base, ddof=1) / math.sqrt(40) / 100
        zs.append((math.log(hi) - math.log(point)) / se_log)
    assert float(np.mean(zs)) == pytest.approx(c1, abs=0.25)
