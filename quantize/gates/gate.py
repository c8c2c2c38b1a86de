"""The gate: compare a candidate with its baseline item by item, rule by rule, and decide.

Scores come from `quantize eval` (cached), so a baseline is scored once. Results whose provenance
differs (golden set, task versions, lm-eval version, suite settings) are refused, naming the field;
the batch size is recorded but may differ (an A/A run at another batch size must pass).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from quantize.errors import UsageError
from quantize.gates import stats
from quantize.gates.policy import AccuracyRule, AgreementMetric, AgreementRule, PerplexityRule, Policy

# Provenance fields that must agree before two results are compared.
MUST_MATCH = ("golden.name", "golden.version", "golden.manifest_sha256", "task_versions", "lm_eval_version",
              "seed", "backend", "dtype")
SUITE_SETTINGS_IGNORED = {"batch_size"}


@dataclass
class RuleResult:
    rule: str
    kind: str
    verdict: str  # pass | regression | inconclusive
    evidence: dict[str, Any]
    p_regression: float | None = None
    p_holm: float | None = None


@dataclass
class Verdict:
    policy: str
    verdict: str  # pass | rejected | inconclusive
    exit_code: int
    rules: list[RuleResult]
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else {}
    return d


def check_provenance(base: dict[str, Any], cand: dict[str, Any]) -> None:
    pb, pc = base["provenance"], cand["provenance"]
    diffs = [f for f in MUST_MATCH if _get(pb, f) != _get(pc, f)]
    sb = {k: v for k, v in pb["suite"]["settings"].items() if k not in SUITE_SETTINGS_IGNORED}
    sc = {k: v for k, v in pc["suite"]["settings"].items() if k not in SUITE_SETTINGS_IGNORED}
    diffs += [f"suite.settings.{k}" for k in sorted(set(sb) | set(sc)) if sb.get(k) != sc.get(k)]
    if diffs:
        shown = "; ".join(f"{f}: baseline {_get(pb, f) if not f.startswith('suite.') else sb.get(f.rsplit('.', 1)[1])!r} "
                          f"vs candidate {_get(pc, f) if not f.startswith('suite.') else sc.get(f.rsplit('.', 1)[1])!r}" for f in diffs)
        raise UsageError(f"refusing to compare scores with different provenance ({shown}). "
                         "Score both with the same suite, golden set and lm-eval version.")


def _paired(base: dict[str, Any], cand: dict[str, Any], task: str) -> tuple[list[dict], list[dict]]:
    if task not in base["tasks"] or task not in cand["tasks"]:
        raise UsageError(f"rule task {task} was not scored; the suite scores: {', '.join(base['tasks'])}")
    b = {i["id"]: i for i in base["tasks"][task]["items"]}
    c = {i["id"]: i for i in cand["tasks"][task]["items"]}
    if set(b) != set(c):
        raise UsageError(f"{task}: baseline and candidate were scored on different items; score both with the same suite")
    ids = sorted(b)
    return [b[i] for i in ids], [c[i] for i in ids]


def accuracy_rule(rule: AccuracyRule, base: dict, cand: dict, alpha: float, power: float) -> RuleResult:
    bi, ci = _paired(base, cand, rule.task)
    d = [c["score"] - b["score"] for b, c in zip(bi, ci)]
    clusters = [b["cluster"] for b in bi]
    r = stats.noninferiority(d, clusters, rule.margin, alpha, power)
    right_wrong = [b["id"] for b, c in zip(bi, ci) if b["score"] > c["score"]]
    wrong_right = [b["id"] for b, c in zip(bi, ci) if b["score"] < c["score"]]
    ev = {
        "n": r.n, "clusters": r.clusters, "baseline": sum(b["score"] for b in bi) / r.n,
        "candidate": sum(c["score"] for c in ci) / r.n, "delta": r.delta, "se_paired": r.se_paired,
        "se_clustered": r.se_clustered, "se": r.se, "lower_bound": r.lower, "upper_bound": r.upper,
        "margin": rule.margin, "alpha": alpha, "flips_right_to_wrong": len(right_wrong),
        "flips_wrong_to_right": len(wrong_right), "mcnemar_p": stats.mcnemar_exact(len(right_wrong), len(wrong_right)),
        "examples_right_to_wrong": right_wrong[:5], "min_detectable_drop": r.min_detectable,
        "items_needed": r.n_needed if r.verdict == "inconclusive" else None,
        "items_needed_at_estimate": r.n_needed_at_estimate if r.verdict == "inconclusive" else None,
    }
    return RuleResult(rule.name or f"{rule.task} acc", "accuracy", r.verdict, ev,
                      p_regression=stats.drop_p(r.delta, r.se))


def perplexity_rule(rule: PerplexityRule, base: dict, cand: dict, alpha: float, seed: int) -> RuleResult:
    bi, ci = _paired(base, cand, rule.task)
    # per item: negative log-likelihood and its unit count (words of a document; 1 target otherwise)
    w = [b.get("words", 1) for b in bi]
    nll_b = [-b["ll"] for b in bi]
    nll_c = [-c["ll"] for c in ci]
    clusters = [b["cluster"] for b in bi]
    ppl_ratio, ppl_lo, ppl_hi = stats.bootstrap_ppl_ratio(nll_b, nll_c, w, clusters, alpha, seed=seed)
    total_w, sb = sum(w), sum(nll_b)
    verdict = "pass" if ppl_hi <= rule.max_ratio else "regression" if ppl_lo > rule.max_ratio else "inconclusive"
    ev = {"n": len(bi), "clusters": len(set(clusters)), "baseline_perplexity": math.exp(sb / total_w),
          "candidate_perplexity": math.exp(sum(nll_c) / total_w), "ratio": ppl_ratio, "lower_bound": ppl_lo,
          "upper_bound": ppl_hi, "max_ratio": rule.max_ratio, "alpha": alpha,
          "interval": "cluster bootstrap percentile, 2000 resamples"}
    return RuleResult(rule.name or f"{rule.task} perplexity", "perplexity", verdict, ev)


def agreement_rule(rule: AgreementRule, agreement: dict[str, Any], alpha: float) -> RuleResult:
    key = {"kl": "kl_mean", "top1": "top1", "sum_min": "sum_min"}[rule.agreement.value]
    value, se = agreement[key], agreement[{"kl_mean": "kl_se"}.get(key, f"{key}_se")]
    q = stats.z(1 - alpha)
    lo, hi = value - q * se, value + q * se
    if rule.agreement is AgreementMetric.kl:
        verdict = "pass" if hi <= rule.max else "regression" if lo > rule.max else "inconclusive"
        limit = {"max": rule.max}
        # p-value of H0 "within the limit" (value <= max) against H1 "beyond it"
        p_reg = float(stats.sps.norm.cdf((rule.max - value) / se)) if se > 0 else float(value <= rule.max)
    else:
        verdict = "pass" if lo >= rule.min else "regression" if hi < rule.min else "inconclusive"
        limit = {"min": rule.min}
        p_reg = float(stats.sps.norm.cdf((value - rule.min) / se)) if se > 0 else float(value >= rule.min)
    ev = {"value": value, "se_clustered": se, "lower_bound": lo, "upper_bound": hi, **limit, "alpha": alpha,
          "positions": agreement["positions"], "items": agreement["items"], "clusters": agreement["clusters"]}
    if rule.agreement is AgreementMetric.kl:
        ev["kl_p99"] = agreement["kl_p99"]
    ev["note"] = agreement["note"]
    return RuleResult(rule.name or f"agreement {rule.agreement.value}", "agreement", verdict, ev, p_regression=p_reg)


def decide(policy: Policy, base: dict[str, Any], cand: dict[str, Any], agreement: dict[str, Any] | None) -> Verdict:
    check_provenance(base, cand)
    seed = base["provenance"]["seed"]
    results = []
    for rule in policy.rules:
        if isinstance(rule, AccuracyRule):
            results.append(accuracy_rule(rule, base, cand, policy.alpha, policy.power))
        elif isinstance(rule, PerplexityRule):
            results.append(perplexity_rule(rule, base, cand, policy.alpha, seed))
        else:
            assert agreement is not None, "agreement rules need the agreement scores"
            results.append(agreement_rule(rule, agreement, policy.alpha))
    with_p = [r for r in results if r.p_regression is not None]
    for r, adj in zip(with_p, stats.holm([r.p_regression for r in with_p])):
        r.p_holm = adj
    if any(r.verdict == "regression" for r in results):
        verdict, code = "rejected", 1
    elif any(r.verdict == "inconclusive" for r in results):
        verdict, code = "inconclusive", 1 if policy.fail_on_inconclusive else 0
    else:
        verdict, code = "pass", 0
    pb, pc = base["provenance"], cand["provenance"]
    provenance = {
        "baseline": {"checkpoint": pb["checkpoint"], "batch_size": pb["batch_size"]},
        "candidate": {"checkpoint": pc["checkpoint"], "batch_size": pc["batch_size"]},
        "golden": pb["golden"], "task_versions": pb["task_versions"], "lm_eval_version": pb["lm_eval_version"],
        "seed": pb["seed"], "suite": pb["suite"]["path"],
    }
    return Verdict(policy.name or "policy", verdict, code, results, provenance)


# --- rendering ------------------------------------------------------------------------------------

def _fmt(x: Any, spec: str = ".4f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else format(x, spec)
    return str(x)


def _items_needed_line(e: dict[str, Any]) -> str:
    """What more items would buy: a pass needs the bound above −m, so the observed Δ matters, not only the variance."""
    at_zero = f"{e['items_needed']:,} if the true Δ were 0"
    if e.get("items_needed_at_estimate") is None:
        return f"    inconclusive: the estimate is past the margin, so more items would settle it as a regression, not a pass ({at_zero})"
    return (f"    inconclusive: at the estimated Δ a pass needs about {e['items_needed_at_estimate']:,} items "
            f"({e['n']:,} here; {at_zero}, at this variance)")


def render_text(v: Verdict) -> str:
    head = {"pass": "PASS", "rejected": "REJECTED", "inconclusive": "INCONCLUSIVE"}[v.verdict]
    p = v.provenance
    tested = sum(r.p_regression is not None for r in v.rules)  # Holm's m
    lines = [f"gate {v.policy}: {head}" + (" (fails closed)" if v.verdict == "inconclusive" and v.exit_code else ""), ""]
    for r in v.rules:
        e = r.evidence
        lines.append(f"[{r.verdict.upper():>12}] {r.rule}")
        if r.kind == "accuracy":
            lines.append(f"    acc {e['baseline']:.4f} -> {e['candidate']:.4f}  Δ = {e['delta']:+.4f}  SE {e['se']:.4f} "
                         f"(paired {e['se_paired']:.4f}, clustered {_fmt(e['se_clustered'])})  n = {e['n']}, {e['clusters']} clusters")
            lines.append(f"    one-sided {1 - e['alpha']:.0%} bounds [{e['lower_bound']:+.4f}, {e['upper_bound']:+.4f}] vs margin "
                         f"−{e['margin']}; smallest drop this n detects: {e['min_detectable_drop']:.4f}")
            lines.append(f"    flips right→wrong {e['flips_right_to_wrong']}, wrong→right {e['flips_wrong_to_right']}; "
                         f"exact McNemar p = {e['mcnemar_p']:.3g}" + (f"; e.g. {', '.join(e['examples_right_to_wrong'][:3])}"
                                                                     if e["examples_right_to_wrong"] else ""))
            if e["items_needed"]:
                lines.append(_items_needed_line(e))
        elif r.kind == "perplexity":
            lines.append(f"    perplexity {e['baseline_perplexity']:.3f} -> {e['candidate_perplexity']:.3f}  ratio {e['ratio']:.4f} "
                         f"[{e['lower_bound']:.4f}, {e['upper_bound']:.4f}] vs max {e['max_ratio']}  n = {e['n']} ({e['interval']})")
        else:
            limit = f"max {e['max']}" if "max" in e else f"min {e['min']}"
            lines.append(f"    {e['value']:.4f} ± {e['se_clustered']:.4f} (clustered SE), bounds [{e['lower_bound']:.4f}, "
                         f"{e['upper_bound']:.4f}] vs {limit}; {e['positions']} positions, {e['items']} items"
                         + (f"; KL p99 {e['kl_p99']:.4f}" if "kl_p99" in e else ""))
        if r.p_holm is not None and r.verdict == "regression":
            h0 = "no drop" if r.kind == "accuracy" else "within the limit"
            lines.append(f"    p = {r.p_regression:.3g} against H0 '{h0}'; Holm-adjusted (m = {tested}): {r.p_holm:.3g}")
    lines += ["", f"provenance: baseline {p['baseline']['checkpoint']['weights_sha256'][:12]} "
                  f"(batch {p['baseline']['batch_size']}), candidate {p['candidate']['checkpoint']['weights_sha256'][:12]} "
                  f"(batch {p['candidate']['batch_size']}); golden {p['golden']['name']}/{p['golden']['version']} "
                  f"({p['golden']['manifest_sha256'][:12]}); tasks {json.dumps(p['task_versions'])}; "
                  f"lm-eval {p['lm_eval_version']}; seed {p['seed']}"]
    return "\n".join(lines)


def render_junit(v: Verdict) -> str:
    def failing(r: RuleResult) -> bool:
        return r.verdict == "regression" or (r.verdict == "inconclusive" and v.exit_code != 0)

    failures = sum(failing(r) for r in v.rules)
    cases = []
    for r in v.rules:
        body = escape(json.dumps(r.evidence, indent=1, default=str))
        inner = ""
        if r.verdict == "regression":
            inner = f"<failure message={quoteattr(f'{r.rule}: regression')} type=\"regression\">{body}</failure>"
        elif failing(r):
            inner = f"<failure message={quoteattr(f'{r.rule}: inconclusive (fails closed)')} type=\"inconclusive\">{body}</failure>"
        else:
            inner = f"<system-out>{body}</system-out>"
        cases.append(f'  <testcase classname={quoteattr("quantize.gate." + v.policy)} name={quoteattr(r.rule)}>{inner}</testcase>')
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name={quoteattr("quantize gate " + v.policy)} '
            f'tests="{len(v.rules)}" failures="{failures}" errors="0">\n' + "\n".join(cases) + "\n</testsuite>\n")


def write_junit(path: Path, v: Verdict) -> None:
    path.write_text(render_junit(v))
