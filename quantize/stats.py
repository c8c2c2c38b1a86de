"""Paired statistics: pure functions on per-item scores (DESIGN.md, "The gate"), below both the
evaluation code (agreement SEs) and the gate (decisions).

For items i = 1..n scored by baseline and candidate on the same golden items:

    Dᵢ = s_candᵢ − s_baseᵢ,   Δ = mean(D)
    paired SE    = sd(D) / √n; for right/wrong items (Dᵢ ∈ {−1, 0, 1}) Agresti–Min's instead:
                   √((b+½ + c+½) − (c − b)²/(n+2)) / (n+2), b, c the flips right→wrong, wrong→right
    clustered SE = √( G/(G−1) · (1/n²) · Σ_c (Σ_{i∈c} (Dᵢ − Δ))² )   over G clusters
    SE = max(paired SE, clustered SE) when items share clusters (G < n), else the paired SE
    LB = Δ − z₁₋α·SE: pass if LB > −m; regression if Δ + z₁₋α·SE < 0 and Δ < −m; else inconclusive
                   (the decision is records.noninferiority_outcome: the gate's, and what a verdict record is held to)
    n needed ≈ (z₁₋α + z₁₋β)² · σ_D² / m²

Sequential design (a gate that looks at the evidence after each stage of items):
    looks at information fractions 0 < t₁ < … < t_K = 1, one-sided level α spent by Lan & DeMets'
    O'Brien–Fleming-type function α(t) = 2 − 2Φ(z₁₋α/₂ / √t); boundary c_k solves
    P(Z₁ < c₁, …, Z_{k−1} < c_{k−1}, Z_k ≥ c_k) = α(t_k) − α(t_{k−1}),  corr(Z_i, Z_j) = √(t_i / t_j), i < j.
    Each one-sided test of a rule (pass: H0 Δ ≤ −m; regression: H0 Δ ≥ 0) uses c_k in place of z₁₋α at look k.
Stratified sample (items drawn within strata h of the baseline's margin, n_h of N_h, N = Σ N_h):
    Δ̂ = Σ_h W_h · mean_h(D),  W_h = N_h / N,   SE² = Σ_h W_h² · SE_h²
    with SE_h the stratum's own SE (Agresti–Min for right/wrong items, clustered when items share clusters).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from quantize.records import RuleOutcome, noninferiority_outcome


def _sps():  # scipy.stats, imported when a statistic is computed: 2-3 s that a refused input never pays
    from scipy import stats

    return stats


def z(p: float) -> float:
    """Standard normal quantile."""
    return float(_sps().norm.ppf(p))


def phi(x: float) -> float:
    """Standard normal distribution function Φ(x)."""
    return float(_sps().norm.cdf(x))


def phi_upper(x: float) -> float:
    """Standard normal upper tail 1 − Φ(x), computed without the cancellation of subtracting Φ(x) from 1."""
    return float(_sps().norm.sf(x))


def paired_se(d: Sequence[float]) -> float:
    n = len(d)
    if n < 2:
        return math.inf
    mean = sum(d) / n
    var = sum((x - mean) * (x - mean) for x in d) / (n - 1)  # x·x: inf past a float's range, ** raised
    return math.sqrt(var / n)


def agresti_min_se(b: int, c: int, n: int) -> float:
    """SE of a paired difference of proportions with Agresti & Min's (2005) adjustment: half an item added
    to each of the four cells. Keeps the SE away from 0 when no item flipped (0 flips in 24 items
    is not proof of no change)."""
    b2, c2, n2 = b + 0.5, c + 0.5, n + 2
    return math.sqrt(max((b2 + c2) - (c2 - b2) ** 2 / n2, 0.0)) / n2


def wilson_bounds(p: float, n: int, q: float) -> tuple[float, float]:
    """Wilson's score bounds on a share p of n 0/1 outcomes at critical value q:
    (p + q²/2n ∓ q·√(p(1 − p)/n + q²/4n²)) / (1 + q²/n). Never 0 wide, and inside [0, 1]: where every outcome
    agrees (p = 1) the lower bound is n / (n + q²), so 20 positions of 20 bound the share at 0.881 at q = 1.645,
    not at 1 as p ± q·SE does with the SE of 0 such outcomes leave."""
    if n <= 0:
        return 0.0, 1.0
    d = 1 + q * q / n
    centre = (p + q * q / (2 * n)) / d
    half = q / d * math.sqrt(max(p * (1 - p), 0.0) / n + q * q / (4 * n * n))
    return max(centre - half, 0.0), min(centre + half, 1.0)


def clustered_se(d: Sequence[float], clusters: Sequence[str]) -> float:
    """Cluster-robust SE of the mean (CR1 small-sample factor G/(G−1)): sqrt(G/(G−1) · Σ_g (Σ_{i∈g} (x_i − x̄))² / n²).
    Items that all share one cluster leave no between-cluster variance to estimate (G = 1 divides by zero): each
    item is then its own cluster, which is the paired SE (paired_se). An infinite SE there made a task whose items
    share one cluster a regression against itself."""
    n = len(d)
    mean = sum(d) / n
    sums: dict[str, float] = defaultdict(float)
    for x, c in zip(d, clusters, strict=True):
        sums[c] += x - mean
    g = len(sums)
    if g < 2:
        return paired_se(d)
    return math.sqrt(g / (g - 1) * sum(s * s for s in sums.values()) / n**2)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: b right→wrong, c wrong→right; binomial(b + c, 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    return float(min(1.0, 2 * _sps().binom.cdf(min(b, c), n, 0.5)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def n_required(sd: float, margin: float, alpha: float, power: float) -> int:
    """Items for a non-inferiority test with margin m to reach the power when the true Δ is 0:
    n = ⌈(z₁₋α + z_power)² · sd² / m²⌉. math.inf where that is no finite number: m ≤ 0, an sd that is not finite,
    an α so small that z₁₋α is infinite (1 − α rounds to 1), a margin so small that m² underflows to 0 (1e-300)
    or a quotient past the largest float; no number of items resolves such a margin."""
    if not margin > 0 or not math.isfinite(sd):
        return math.inf  # type: ignore[return-value]
    try:
        n = (z(1 - alpha) + z(power)) ** 2 * sd**2 / margin**2
    except (ZeroDivisionError, OverflowError):  # m² underflowed to 0; a square past the largest float
        return math.inf  # type: ignore[return-value]
    return math.ceil(n) if math.isfinite(n) else math.inf  # type: ignore[return-value]


def min_detectable(sd: float, n: int, alpha: float, power: float) -> float:
    """The smallest drop this n detects at level α with the given power."""
    return (z(1 - alpha) + z(power)) * sd / math.sqrt(n) if n > 0 else math.inf


@dataclass
class Comparison:
    n: int
    clusters: int
    delta: float
    se_paired: float
    se_clustered: float
    se: float  # the one used: max(paired, clustered) when items share clusters, else paired
    lower: float
    upper: float
    verdict: RuleOutcome
    n_needed: int  # items for the planned power if the true Δ were 0 (DESIGN's formula)
    n_needed_at_estimate: int | None  # items for a pass if the true Δ equals the estimate; None: past the margin
    min_detectable: float
    sd: float


def _mean_se(d: Sequence[float], clusters: Sequence[str]) -> tuple[float, float, float, float]:
    """(mean, paired SE, clustered SE, the SE used) of one sample of paired differences: Agresti–Min for
    right/wrong items, the larger of paired and clustered when items share clusters."""
    n = len(d)
    right_wrong = all(x in (-1, 0, 1) for x in d)  # right/wrong items: flips b (1→0) and c (0→1)
    sp = agresti_min_se(sum(x == -1 for x in d), sum(x == 1 for x in d), n) if right_wrong else paired_se(d)
    g = len(set(clusters))
    sc = clustered_se(d, clusters) if g < n else sp
    se = max(sp, sc) if g < n and math.isfinite(sc) else sp
    return sum(d) / n, sp, sc, se


def stratified(
    d: Sequence[float], clusters: Sequence[str], strata: Sequence[str], population: dict[str, int]
) -> tuple[float, float, float, float]:
    """Design-weighted (mean, paired SE, clustered SE, SE) of a stratified sample: Δ̂ = Σ_h W_h·mean_h,
    SE² = Σ_h W_h²·SE_h², W_h = N_h/N from `population` (items per stratum in the golden set). Unbiased for the
    golden set's mean difference whatever the candidate does, when items are drawn at random within strata.
    With one stratum it is the unstratified sample's (mean, SEs)."""
    by: dict[str, tuple[list[float], list[str]]] = defaultdict(lambda: ([], []))
    for x, c, h in zip(d, clusters, strata, strict=True):
        by[h][0].append(x)
        by[h][1].append(c)
    total = sum(population.values())
    if set(by) - set(population):
        raise ValueError(f"items from strata {sorted(set(by) - set(population))} outside the population")
    if set(population) - set(by):  # a stratum with items in the set and none drawn cannot be estimated
        return math.nan, math.inf, math.inf, math.inf
    if len(by) == 1:
        return _mean_se(d, clusters)
    mean = vp = vc = v = 0.0
    for h, (dh, ch) in by.items():
        w = population[h] / total
        m_h, sp_h, sc_h, se_h = _mean_se(dh, ch)
        mean += w * m_h
        vp += (w * sp_h) ** 2
        vc += (w * sc_h) ** 2
        v += (w * se_h) ** 2
    return mean, math.sqrt(vp), math.sqrt(vc), math.sqrt(v)


def design_weights(strata: Sequence[str], population: dict[str, int]) -> list[float]:
    """Each sampled item's design weight w_i = N_h / n_h for its stratum h (`strata`, one per item): N_h the items
    of h in the golden set (`population`), n_h those of h in the sample; Σ_{i∈h} w_i = N_h, so a weighted sum
    estimates the whole set's (bootstrap_ppl_ratio's `weights`)."""
    drawn = Counter(strata)
    return [population[h] / drawn[h] for h in strata]


def obf_spending(t: float, alpha: float) -> float:
    """Lan–DeMets O'Brien–Fleming-type alpha spent by information fraction t: α(t) = 2 − 2Φ(z₁₋α/₂ / √t), computed
    as 2·(1 − Φ)(·) so that an early look's tiny α(t) is not rounded to 0."""
    if t <= 0:
        return 0.0
    return float(2 * _sps().norm.sf(z(1 - alpha / 2) / math.sqrt(min(t, 1.0))))


MIN_LOOK_SPEND = 1e-4  # the least alpha a look after the first may spend: ten times the joint normal's accuracy


def sequential_bounds(looks: Sequence[float], alpha: float) -> list[float]:
    """One-sided group-sequential boundaries c_1..c_K for looks at information fractions t_k (increasing,
    last 1), spending α by obf_spending: P(cross at look k, not before) = α(t_k) − α(t_{k−1}) under H0.
    One look gives z₁₋α. Joint normal probabilities by scipy's multivariate_normal (Genz, absolute error about
    1e-5), seeded: a look after the first that spends less than MIN_LOOK_SPEND cannot have its boundary computed
    (looks [0.01, 0.02, 1] ended the gate in exit 3 after the baseline was scored) and is a ValueError naming it.
    The first look's c₁ = (1 − Φ)⁻¹(α(t₁)) is exact however small α(t₁) is."""
    import numpy as np
    from scipy.optimize import brentq

    t = list(looks)
    if not t or any(b <= a for a, b in pairwise(t)) or t[0] <= 0 or abs(t[-1] - 1) > 1e-12:
        raise ValueError(f"looks {t}: give increasing information fractions in (0, 1] ending at 1")
    bounds: list[float] = []
    spent = 0.0
    for k, tk in enumerate(t):
        target = obf_spending(tk, alpha) - spent
        if k == 0:
            c = float(_sps().norm.isf(target))
        elif target < MIN_LOOK_SPEND:
            raise ValueError(
                f"look {k + 1} at {tk} spends {target:.1e} of alpha {alpha} (O'Brien-Fleming spends almost nothing "
                f"that early), below the {MIN_LOOK_SPEND:g} its boundary can be computed from: start the looks later "
                "or space them wider, e.g. [0.2, 0.5, 1.0]"
            )
        else:
            ts = np.asarray(t[: k + 1])
            cov = np.sqrt(np.minimum.outer(ts, ts) / np.maximum.outer(ts, ts))
            prev = _sps().multivariate_normal(mean=np.zeros(k), cov=cov[:k, :k], seed=0)
            full = _sps().multivariate_normal(mean=np.zeros(k + 1), cov=cov, seed=0)
            p_prev = float(prev.cdf(np.asarray(bounds))) if k > 1 else float(_sps().norm.cdf(bounds[0]))

            def excess(c: float, p_prev: float = p_prev, full=full, target: float = target) -> float:
                # P(no crossing before k) − P(no crossing through k) = P(first crossing at k)
                return p_prev - float(full.cdf(np.asarray([*bounds, c]))) - target

            c = brentq(excess, 0.0, 8.0, xtol=1e-6)
        if not math.isfinite(c):
            raise ValueError(f"look {k + 1} at {tk}: its boundary is not finite (alpha {alpha}); space the looks wider")
        bounds.append(float(c))
        spent = obf_spending(tk, alpha)
    return bounds


def noninferiority(  # noqa: PLR0913 (the formula's inputs: D, clusters, m, α, power, the design h/N_h, its bound)
    d: Sequence[float],
    clusters: Sequence[str],
    margin: float,
    alpha: float,
    power: float,
    strata: Sequence[str] | None = None,
    population: dict[str, int] | None = None,
    bound: float | None = None,
) -> Comparison:
    """One-sided non-inferiority of the candidate with absolute margin m (m > 0: a drop of m is tolerated).
    `strata`/`population`: a stratified sample (design-weighted Δ̂ and SE); `bound`: the critical value of
    this look of a sequential design (default z₁₋α, the fixed design)."""
    n = len(d)
    if n == 0:
        raise ValueError("no paired items to compare")
    right_wrong = all(x in (-1, 0, 1) for x in d)
    g = len(set(clusters))
    if strata is not None and population is not None:
        delta, sp, sc, se = stratified(d, clusters, strata, population)
    else:
        delta, sp, sc, se = _mean_se(d, clusters)
    q = z(1 - alpha) if bound is None else bound
    lo, hi = delta - q * se, delta + q * se
    if right_wrong:  # a difference of two proportions lies in [−1, 1]; so do its bounds
        lo, hi = max(lo, -1.0), min(hi, 1.0)
    verdict = noninferiority_outcome(delta, lo, hi, margin)
    sd = se * math.sqrt(n) if math.isfinite(se) else math.inf
    return Comparison(
        n=n,
        clusters=g,
        delta=delta,
        se_paired=sp,
        se_clustered=sc,
        se=se,
        lower=lo,
        upper=hi,
        verdict=verdict,
        n_needed=n_required(sd, margin, alpha, power),
        n_needed_at_estimate=n_required(sd, margin + min(delta, 0.0), alpha, power) if delta > -margin else None,
        min_detectable=min_detectable(sd, n, alpha, power),
        sd=sd,
    )


def drop_p(delta: float, se: float) -> float:
    """p-value of H0: Δ >= 0 (no drop) against H1: Δ < 0, the test behind a "regression" verdict
    (significantly worse, Δ + z·SE < 0, with the estimate beyond the margin)."""
    if not math.isfinite(se) or se == 0:
        return 0.0 if delta < 0 else 1.0
    return float(_sps().norm.cdf(delta / se))


def bootstrap_ppl_ratio(  # noqa: PLR0913 (the formula's inputs: NLLs, units, clusters, α, draws, seed, wᵢ)
    nll_base: Sequence[float],
    nll_cand: Sequence[float],
    units: Sequence[float],
    clusters: Sequence[str],
    alpha: float,
    iters: int = 2000,
    seed: int = 0,
    weights: Sequence[float] | None = None,
) -> tuple[float, float, float]:
    """Perplexity ratio candidate/baseline = exp((Σ wᵢ·NLL_candᵢ − Σ wᵢ·NLL_baseᵢ) / Σ wᵢ·unitsᵢ), with one-sided α
    and 1−α percentile bounds from a bootstrap that resamples whole clusters (paired: both models move together).
    `weights` wᵢ (default 1): an item's design weight in a stratified sample, N_h / n_h of its stratum h (the items
    it stands for), so that a sample taking every item of one stratum and a third of another estimates the whole
    set's ratio, not the sample's. Documents
    that all share one cluster are resampled one by one (as clustered_se takes each item as its own cluster): one
    cluster resampled gave the point estimate as both bounds, a pass without uncertainty. A ratio past a float's
    range is infinite (a candidate's log-likelihoods thousands of nats worse), never an OverflowError.

    A level the resamples cannot resolve (α · iters < MIN_TAIL_DRAWS: a sequential first look's 1.2e-5 of 2000
    draws is the sample's extreme, a critical value of about 3.4 where the look's is 4.23) takes the normal bound
    on the log ratio with the bootstrap's standard deviation instead: exp(log r̂ ∓ z₁₋α · sd(log r*))."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if len(set(clusters)) < 2:
        clusters = [str(i) for i in range(len(clusters))]
    keys = sorted(set(clusters))
    idx = {k: i for i, k in enumerate(keys)}
    diff = np.zeros(len(keys))  # Σ (NLL_cand − NLL_base) per cluster
    w = np.zeros(len(keys))
    for b, c, u, k, wt in zip(nll_base, nll_cand, units, clusters, weights or [1.0] * len(units), strict=True):
        diff[idx[k]] += wt * (c - b)
        w[idx[k]] += wt * u
    with np.errstate(over="ignore", invalid="ignore"):
        point = float(np.exp(diff.sum() / w.sum()))
        draws = rng.integers(0, len(keys), size=(iters, len(keys)))
        ratios = np.exp(diff[draws].sum(1) / w[draws].sum(1))
        # two infinite neighbours interpolate to inf − inf = NaN: that quantile is infinite
        lo, hi = np.nan_to_num(np.quantile(ratios, [alpha, 1 - alpha]), nan=np.inf)
        if alpha * iters < MIN_TAIL_DRAWS and np.isfinite(ratios).all():
            c, sd = float(_sps().norm.isf(alpha)), float(np.log(ratios).std(ddof=1))
            lo, hi = point * math.exp(-c * sd), point * math.exp(c * sd)
    return point, float(lo), float(hi)


MIN_TAIL_DRAWS = 10  # resamples beyond a percentile bound, at least, for the bootstrap to resolve it
