"""Simulated gates over real per-item data: the fixed design and the policy's sequential design side by side.

    python benchmarks/gate_sim.py --policy gates/ci.yaml --baseline BASE --harmless outputs/fp8-e4m3 \
        [--sims 10000] [--out benchmarks/results/gate_sim.json]

Both checkpoints must already be scored on the policy's suite (cached by `quantize eval`/`quantize gate`). Each
simulated gate draws a golden set of the same size by resampling the real set's clusters with replacement, then
builds a candidate from the real (baseline, harmless candidate) item pairs:

    harmless   the pairs as measured (e.g. FP8 against its baseline): a pass is right, a regression is a false reject
    null       each pair's two sides swapped with probability 1/2: E[Δ] = 0 exactly, at the measured flip rate;
               a regression is a false reject, the pass rate is the power at Δ = 0
    margin     null, plus right→wrong flips planted on m·N baseline-right unflipped items chosen at random: the true
               Δ is −m; a pass is a false pass (should be ≤ α)
    margin-stable  the same, with the planted flips only on items the baseline calls stable (the strata guessed
               wrong): the design-weighted estimator must stay honest
    perplexity rules: harmless (documents as measured) and limit (every candidate document's NLL raised so that
               the true ratio is the rule's max_ratio exactly; a pass is a false pass)

--staged-noise FILE (benchmarks/batch_variance.py's JSON) flips the candidate's items in the sequential design at the
measured rates between a full run and a staged one (P(right→wrong), P(wrong→right) per task; --noise-scale
multiplies them): the noise the stages' other batch compositions add, tested against the error rates.

Each design is run with the project's own functions (quantize.stats, quantize.gates.sequential): the fixed design
tests every item once at z₁₋α; the sequential one tests each look's stratified sample at c_k and stops at the first
decision. Agreement rules are not simulated here (the sequential gate runs them in agreement looks of their own
before the first score look, the fixed design once on every agreement item).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantize import stats
from quantize.checkpoint.files import identity_sha256
from quantize.evaluate import cache
from quantize.evaluate.suite import open_suite
from quantize.gates import sequential as sq
from quantize.gates.policy import AccuracyRule, PerplexityRule, Sequential, load_policy


def cached_scores(suite, ckpt: Path):
    from quantize.evaluate.score import runtime

    doc = cache.lookup_scores(suite, identity_sha256(ckpt), runtime(suite, False))
    if doc is None:
        sys.exit(f"{ckpt} is not scored on {suite.path}: run `quantize eval {suite.path} {ckpt}` first")
    return doc


def resample(rng, clusters: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Item indices of a cluster bootstrap (as many clusters as the set has, drawn with replacement) and each
    drawn item's cluster label (a cluster drawn twice is two clusters)."""
    keys, inv = np.unique(clusters, return_inverse=True)
    members = [np.flatnonzero(inv == g) for g in range(len(keys))]
    pick = rng.integers(0, len(keys), len(keys))
    labels = [str(n) for n, g in enumerate(pick) for _ in members[g]]
    return np.concatenate([members[g] for g in pick]), labels


def accuracy_sims(rule, base_items, cand_items, seq, alpha, power, sims, seed, noise=None):
    """noise: (P(right→wrong), P(wrong→right)) applied to the candidate's items in the sequential design only (the
    staged runs' batch noise; the fixed design is one full run), from a stream of its own, so both designs and
    the noiseless run see the same resampled sets."""
    b = np.asarray([i.score for i in base_items])
    c = np.asarray([i.score for i in cand_items])
    cl = np.asarray([i.cluster for i in base_items])
    strata = np.asarray([sq.stratum(i, seq.stable_margin) for i in base_items])
    bounds = stats.sequential_bounds(seq.looks, alpha)
    m = rule.margin
    out = {}
    for scenario in ("harmless", "null", "margin", "margin-stable"):
        rng, noise_rng = np.random.default_rng(seed), np.random.default_rng([seed, 1])
        tally = {
            "fixed": {"pass": 0, "regression": 0, "inconclusive": 0, "items": 0},
            "sequential": {"pass": 0, "regression": 0, "inconclusive": 0, "items": 0, "looks": [0] * len(bounds)},
            "true_delta": 0.0,
        }
        for s in range(sims):
            idx, clusters = resample(rng, cl)
            bb, cc, h = b[idx].copy(), c[idx].copy(), strata[idx]
            if scenario != "harmless":
                swap = rng.random(len(idx)) < 0.5
                bb, cc = np.where(swap, cc, bb), np.where(swap, bb, cc)
            if scenario.startswith("margin"):
                pool = np.flatnonzero(
                    (bb == 1) & (cc == 1) & ((h == sq.STABLE) if scenario == "margin-stable" else True)
                )
                k = min(len(pool), round(m * len(idx)))
                cc[rng.choice(pool, k, replace=False)] = 0
            d = list(cc - bb)
            tally["true_delta"] += float(np.mean(cc - bb))
            r = stats.noninferiority(d, clusters, m, alpha, power)
            tally["fixed"][r.verdict] += 1
            tally["fixed"]["items"] += len(d)
            ds = d
            if noise is not None:
                u = noise_rng.random(len(cc))
                ds = list(np.where(cc == 1, (u >= noise[0]).astype(float), (u < noise[1]).astype(float)) - bb)
            ids = [str(k) for k in range(len(idx))]
            population: dict[str, int] = {}
            for x in h:
                population[x] = population.get(x, 0) + 1
            draws = sq.draws(seq, dict(zip(ids, h, strict=True)), f"{seed}:{s}", seq.fraction(rule.task))
            for look, (drawn, bound) in enumerate(zip(draws, bounds, strict=True)):
                j = np.asarray([int(x) for x in drawn])
                r = stats.noninferiority(
                    [ds[x] for x in j], [clusters[x] for x in j], m, alpha, power, list(h[j]), population, bound=bound
                )
                if r.verdict != "inconclusive" or look == len(bounds) - 1:
                    break
            tally["sequential"][r.verdict] += 1
            tally["sequential"]["items"] += len(j)
            tally["sequential"]["looks"][look] += 1
        out[scenario] = _rates(tally, sims)
    return out


def perplexity_sims(rule, base_items, cand_items, seq, alpha, sims, seed, iters):
    nb = np.asarray([-i.ll for i in base_items])
    nc = np.asarray([-i.ll for i in cand_items])
    w = np.asarray([i.units for i in base_items], dtype=float)
    cl = np.asarray([i.cluster for i in base_items])
    bounds = stats.sequential_bounds(seq.looks, alpha)
    out = {}
    for scenario in ("harmless", "limit"):
        rng = np.random.default_rng(seed)
        tally = {
            "fixed": {"pass": 0, "regression": 0, "inconclusive": 0, "items": 0},
            "sequential": {"pass": 0, "regression": 0, "inconclusive": 0, "items": 0, "looks": [0] * len(bounds)},
        }
        for s in range(sims):
            idx, clusters = resample(rng, cl)
            b, c, u = nb[idx], nc[idx].copy(), w[idx]
            if scenario == "limit":  # raise every document's NLL per word so that exp(Σ(c−b)/Σu) = max_ratio
                c = c + u * (math.log(rule.max_ratio) - (c - b).sum() / u.sum())

            def verdict(j, level, b=b, c=c, u=u, clusters=clusters, s=s):
                _, lo, hi = stats.bootstrap_ppl_ratio(
                    b[j], c[j], u[j], [clusters[x] for x in j], level, iters=iters, seed=s
                )
                return "pass" if hi <= rule.max_ratio else "regression" if lo > rule.max_ratio else "inconclusive"

            every = np.arange(len(idx))
            tally["fixed"][verdict(every, alpha)] += 1
            tally["fixed"]["items"] += len(idx)
            draws = sq.draws(seq, {str(k): sq.ALL for k in range(len(idx))}, f"{seed}:{s}", 1.0)
            look = 0
            for look, (drawn, bound) in enumerate(zip(draws, bounds, strict=True)):  # noqa: B007 - used after
                j = np.asarray([int(x) for x in drawn])
                v = verdict(j, float(stats.sps.norm.sf(bound)))
                if v != "inconclusive":
                    break
            tally["sequential"][v] += 1
            tally["sequential"]["items"] += len(j)
            tally["sequential"]["looks"][look] += 1
        out[scenario] = _rates(tally, sims)
    return out


def _rates(tally, sims):
    out = {"true_delta": tally.pop("true_delta") / sims} if "true_delta" in tally else {}
    for design, t in tally.items():
        out[design] = {k: t[k] / sims for k in ("pass", "regression", "inconclusive")}
        out[design]["mean_items"] = t["items"] / sims
        if "looks" in t:
            out[design]["decided_at_look"] = [x / sims for x in t["looks"]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default="gates/ci.yaml")
    ap.add_argument("--baseline", required=True, type=Path)
    ap.add_argument("--harmless", required=True, type=Path)
    ap.add_argument("--sims", type=int, default=10_000)
    ap.add_argument("--ppl-iters", type=int, default=2000, help="bootstrap resamples per perplexity test (gate: 2000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--tasks", nargs="*", help="simulate only the rules on these tasks (each rule's sims are seeded alike)"
    )
    ap.add_argument(
        "--staged-noise",
        type=Path,
        help="benchmarks/batch_variance.py's JSON: flip the sequential design's candidate items at its flip_rates",
    )
    ap.add_argument("--noise-scale", type=float, default=1.0, help="multiply the flip rates (a stress test)")
    args = ap.parse_args()
    noise = {}
    if args.staged_noise:
        rates = json.loads(args.staged_noise.read_text())["flip_rates"]
        noise = {
            t: (r["right_to_wrong"] * args.noise_scale, r["wrong_to_right"] * args.noise_scale)
            for t, r in rates.items()
        }
    policy = load_policy(args.policy)
    seq = policy.sequential or Sequential()
    suite = open_suite(policy.suite)
    base, cand = cached_scores(suite, args.baseline), cached_scores(suite, args.harmless)
    t0 = time.perf_counter()
    report = {
        "policy": str(args.policy),
        "golden": suite.golden.manifest.version,
        "sims": args.sims,
        "alpha": policy.alpha,
        "sequential": seq.model_dump(),
        "bounds": stats.sequential_bounds(seq.looks, policy.alpha),
        "baseline": str(args.baseline),
        "harmless": str(args.harmless),
        "staged_noise": {"file": str(args.staged_noise), "scale": args.noise_scale, "rates": noise} if noise else None,
        "rules": {},
    }
    for i, rule in enumerate(policy.rules):
        if args.tasks and getattr(rule, "task", None) not in args.tasks:
            continue
        if isinstance(rule, AccuracyRule):
            bi, ci = base.tasks[rule.task].items, cand.tasks[rule.task].items
            res = accuracy_sims(
                rule, bi, ci, seq, policy.alpha, policy.power, args.sims, args.seed, noise.get(rule.task)
            )
        elif isinstance(rule, PerplexityRule):
            bi, ci = base.tasks[rule.task].items, cand.tasks[rule.task].items
            res = perplexity_sims(rule, bi, ci, seq, policy.alpha, args.sims, args.seed, args.ppl_iters)
        else:
            continue
        report["rules"][policy.label(i)] = res
        for scenario, r in res.items():
            f, s = r["fixed"], r["sequential"]
            if "true_delta" in r:
                scenario = f"{scenario} {r['true_delta']:+.3f}"
            print(
                f"{policy.label(i):>24} {scenario:>13}  fixed pass {f['pass']:.4f} reg {f['regression']:.4f} "
                f"items {f['mean_items']:.0f} | sequential pass {s['pass']:.4f} reg {s['regression']:.4f} "
                f"items {s['mean_items']:.0f} looks {' '.join(f'{x:.2f}' for x in s['decided_at_look'])}",
                flush=True,
            )
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
