"""A verdict as text for people and as JUnit XML for CI (one test case per rule)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from quantize.records import (
    AccuracyEvidence,
    AccuracyResult,
    AccuracySizing,
    AgreementEvidence,
    AgreementRuleResult,
    PerplexityResult,
    SizingReport,
    UntestedResult,
    Verdict,
    VerdictProvenance,
)
from quantize.tables import counted, markdown_cell, md_code, md_text, printable
from quantize.tables import text_table as table


def _fmt(x: Any, spec: str = ".4f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else format(x, spec)
    return str(x)


def _agreement_bounds(e: AgreementEvidence) -> str:
    """Value ± clustered SE and the bounds, saying where top-1's Wilson bounds over the positions set them."""
    wilson = e.wilson_bounds is not None and e.lower_bound == e.wilson_bounds[0] < e.value - 1e-12
    return f"{e.value:.4f} ± {_fmt(e.se_clustered)} (clustered SE), bounds [{e.lower_bound:.4f}, " + (
        f"{e.upper_bound:.4f}] (Wilson's over the positions, wider)" if wilson else f"{e.upper_bound:.4f}]"
    )


def _items_needed_line(e: AccuracyEvidence) -> str:
    """What more items would buy: a pass needs the bound above −m, so the observed Δ matters, not only the variance."""
    at_zero = f"{_fmt(e.items_needed, ',')} if the true Δ were 0"
    if e.items_needed_at_estimate is None:
        return (
            "    inconclusive: the estimate is past the margin, so more items would settle it as a regression, "
            f"not a pass ({at_zero})"
        )
    return (
        f"    inconclusive: at the estimated Δ a pass needs about {_fmt(e.items_needed_at_estimate, ',')} items "
        f"({e.n:,} here; {at_zero}, at this variance)"
    )


HEADS = {"pass": "PASS", "rejected": "REJECTED", "inconclusive": "INCONCLUSIVE"}


def fails_closed(v: Verdict) -> str:
    """The words " (fails closed)" where an inconclusive verdict is a failure (the policy's default), else none."""
    return " (fails closed)" if v.verdict == "inconclusive" and v.exit_code else ""


def failed_rules(v: Verdict) -> list[str]:
    """The rules that did not pass, each with its outcome: "core_kv acc regression", "core_kv acc regression
    (non-finite)" where the candidate computes NaN or infinity (no drop was measured: there is no figure)."""
    return [
        f"{r.rule} {r.verdict}" + (" (non-finite)" if getattr(r, "non_finite", None) else "")
        for r in v.rules
        if r.verdict not in ("pass", "untested")
    ]


def _candidate(r: Any, figure: str) -> str:
    """A rule's candidate figure as shown, or "non-finite" where the gate marked its evidence so: over NaN
    log-likelihoods lm-eval's accuracy is its argmax's first choice, a finite number that is no score."""
    return "non-finite" if getattr(r, "non_finite", None) else figure


def headline(v: Verdict) -> str:
    """One line: the verdict and the rules that did not pass, as `make gate-these` prints it."""
    bad = failed_rules(v)
    return HEADS[v.verdict] + (f" ({', '.join(bad)})" if bad else "")


def render_text(v: Verdict) -> str:
    head = HEADS[v.verdict]
    p = v.provenance
    tested = sum(r.p_regression is not None for r in v.rules)  # Holm's m
    lines = [
        f"gate {printable(v.policy)}: {head}{fails_closed(v)}",
        "",
    ]
    sq = v.sequential
    if sq is not None:
        scored, total = sum(sq.items_scored.values()), sum(sq.items_total.values())
        when = f"; candidate scored in {sq.candidate_seconds:.0f} s" if sq.candidate_seconds is not None else ""
        taken = (
            f"{sq.looks_taken} of {len(sq.looks)} looks" if sq.looks_taken else "stopped by agreement before any look"
        )
        if sq.agreement_looks_taken:
            taken += f" after {sq.agreement_looks_taken} agreement look{'s' if sq.agreement_looks_taken > 1 else ''}"
        lines += [
            f"sequential: {taken} (at {', '.join(f'{t:g}' for t in sq.looks)} of "
            f"the plan; critical values {', '.join(f'{c:.3f}' for c in sq.bounds)}), {scored:,} of {total:,} items "
            f"scored{when}",
            "    " + ", ".join(f"{t} {sq.items_scored[t]}/{sq.items_total[t]}" for t in sq.items_total),
            "",
        ]
    for r in v.rules:
        when = "agreement look" if isinstance(r, AgreementRuleResult) else "look"
        lines.append(
            f"[{r.verdict.upper():>12}] {printable(r.rule)}" + (f"  ({when} {r.look})" if r.look is not None else "")
        )
        if getattr(r, "non_finite", None):
            lines.append(f"    not finite: {r.non_finite}; a regression, whatever the statistics below say")
        if isinstance(r, AccuracyResult):
            e = r.evidence
            lines.append(
                f"    {printable(r.metric or 'acc')} {e.baseline:.4f} -> {_candidate(r, f'{e.candidate:.4f}')}  "
                f"Δ = {e.delta:+.4f}  "
                f"SE {e.se:.4f} "
                f"(paired {e.se_paired:.4f}, clustered {_fmt(e.se_clustered)})  n = {e.n}, {e.clusters} clusters"
            )
            lines.append(
                (
                    f"    look {r.look} bounds (critical value {sq.bounds[r.look - 1]:.3f})"
                    if sq and r.look
                    else f"    one-sided {1 - e.alpha:.0%} bounds"
                )
                + f" [{e.lower_bound:+.4f}, {e.upper_bound:+.4f}] vs margin "
                f"−{e.margin}; smallest drop this n detects: {e.min_detectable_drop:.4f}"
            )
            lines.append(
                f"    flips right→wrong {e.flips_right_to_wrong}, wrong→right {e.flips_wrong_to_right}; "
                f"exact McNemar p = {e.mcnemar_p:.3g}"
                + (f"; e.g. {printable(', '.join(e.examples_right_to_wrong[:3]))}" if e.examples_right_to_wrong else "")
            )
            if e.items_needed:
                lines.append(_items_needed_line(e))
        elif isinstance(r, UntestedResult):
            lines.append(f"    {printable(r.reason)}")
        elif isinstance(r, PerplexityResult):
            e = r.evidence
            lines.append(
                f"    perplexity {e.baseline_perplexity:.3f} -> {_candidate(r, f'{e.candidate_perplexity:.3f}')}  "
                f"ratio {e.ratio:.4f} "
                f"[{e.lower_bound:.4f}, {e.upper_bound:.4f}] vs max {e.max_ratio}  n = {e.n} ({e.interval})"
            )
        else:
            e = r.evidence
            limit = f"max {e.max}" if e.max is not None else f"min {e.min}"
            lines.append(
                f"    {_agreement_bounds(e)}"
                + (f" (critical value {sq.bounds[r.look - 1]:.3f})" if sq and r.look else "")
                + f" vs {limit}; {e.positions} positions, {e.items} items"
                + (f"; KL p99 {e.kl_p99:.4f}" if e.kl_p99 is not None else "")
            )
        if r.p_holm is not None and r.verdict == "regression":
            h0 = "no drop" if r.kind == "accuracy" else "within the limit"
            lines.append(
                f"    p = {r.p_regression:.3g} against H0 '{h0}'; Holm-adjusted (m = {tested}): {r.p_holm:.3g}"
            )
    lines += [f"note: {printable(n)}" for n in v.notes]
    b, c = p.baseline.checkpoint, p.candidate.checkpoint
    lines += [
        "",
        f"provenance: baseline {b.identity_sha256[:12]} (weights {b.weights_sha256[:12]}, "
        f"batch {p.baseline.batch_size}), candidate {c.identity_sha256[:12]} (weights {c.weights_sha256[:12]}, "
        f"batch {p.candidate.batch_size}); golden {p.golden.name}/{p.golden.version} "
        f"({p.golden.manifest_sha256[:12]}); tasks {json.dumps(p.task_versions)}; "
        f"lm-eval {p.lm_eval_version}; seed {p.seed}",
    ]
    lines += computed_on(p)
    return "\n".join(lines)


JUNIT_SUITE = "quantize gate "  # how every testsuite render_junit writes is named: the policy follows


def is_gate_junit(raw: bytes) -> bool:
    """Whether `raw` is a JUnit file `render_junit` wrote (what `--junit` may replace): it begins as every one does,
    ElementTree's XML declaration, then a testsuite named "quantize gate POLICY". Another tool's JUnit XML (a test
    run's results) is not ours to replace; nothing is parsed (an XML file a user names is not expanded here)."""
    probe = ET.tostring(ET.Element("testsuite", name=JUNIT_SUITE), encoding="unicode", xml_declaration=True)
    return raw.startswith(probe[: probe.index(JUNIT_SUITE) + len(JUNIT_SUITE)].encode())


def render_junit(v: Verdict) -> str:
    """JUnit XML: a test case per rule; a regression, or an inconclusive rule that fails closed, is a failure.
    ElementTree escapes markup; names and reasons go through `printable` too, so that none holds a control character
    (not XML 1.0) or a line break that a test report would show as a new line."""

    def failing(verdict: str) -> bool:
        return verdict == "regression" or (verdict == "inconclusive" and v.exit_code != 0)

    suite = ET.Element(
        "testsuite",
        name=f"{JUNIT_SUITE}{printable(v.policy)}",
        tests=str(len(v.rules)),
        failures=str(sum(failing(r.verdict) for r in v.rules)),
        errors="0",
    )
    for r in v.rules:
        rule = printable(r.rule)
        case = ET.SubElement(suite, "testcase", classname=f"quantize.gate.{printable(v.policy)}", name=rule)
        if isinstance(r, UntestedResult):
            ET.SubElement(case, "skipped", message=printable(r.reason))
            continue
        body = json.dumps(r.evidence.model_dump(), indent=1, default=str)  # JSON escapes every control character
        if r.verdict == "regression":
            why = f" ({printable(r.non_finite)})" if r.non_finite else ""
            ET.SubElement(case, "failure", message=f"{rule}: regression{why}", type="regression").text = body
        elif failing(r.verdict):
            ET.SubElement(
                case, "failure", message=f"{rule}: inconclusive (fails closed)", type="inconclusive"
            ).text = body
        else:
            ET.SubElement(case, "system-out").text = body
    ET.indent(suite, space="  ")
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def sizing_text(report: SizingReport) -> str:
    """`quantize golden size` as text: per task the flip rate and the items a margin needs."""
    a, pw, m = report.alpha, report.power, report.margin
    rows: list[list[Any]] = []
    for t in report.tasks:
        if isinstance(t, AccuracySizing):
            name = t.task if t.metric == "acc" else f"{t.task} {t.metric}"
            rows.append(
                [name, t.n, t.clusters, f"{t.flip_rate:.3f}", f"{t.delta:+.3f}", f"{t.min_detectable_drop:.3f}"]
                + [t.items_needed]
            )
        else:
            rows.append(
                [t.task, t.n, t.clusters, "-", f"ppl x{t.ratio:.4f}", f"+{t.half_width:.2%} (upper bound)"]
                + [f"{t.documents_needed} for ±{report.ppl_half_width:.0%}"]
            )
    head = [
        "task",
        "items",
        "clusters",
        "flip rate",
        "Δ candidate−baseline",
        "smallest drop detected",
        f"items for {m:.3f}",
    ]
    return (
        f"sizing {report.golden} from {report.baseline} vs {report.candidate} "
        f"(one-sided α = {a}, power {pw}, margin {m}):\n"
        + table(rows, head)
        + "\nitems needed: to resolve a drop of the margin with this pair's measured flip rate and clustering; "
        "use a harmless candidate (e.g. 8-bit) to size for passes."
    )


HEADLINE = {"pass": "✅ PASS", "rejected": "❌ REJECTED", "inconclusive": "⚠️ INCONCLUSIVE"}


def _md_row(r: Any) -> list[str]:
    """One rule as a Markdown table row, each cell Markdown already: rule (as code), verdict, baseline, candidate,
    change, bounds, limit."""
    rule = markdown_cell(md_code(r.rule))
    verdict = md_text(r.verdict + (f" ({r.non_finite})" if getattr(r, "non_finite", None) else ""))
    if isinstance(r, UntestedResult):
        return [rule, "untested", "-", "-", "-", "-", md_text(r.reason)]
    e = r.evidence
    measured = not r.non_finite  # else no candidate figure, change or bounds: the verdict cell says why
    if isinstance(r, AccuracyResult):
        bounds = f"[{e.lower_bound:+.4f}, {e.upper_bound:+.4f}]" if measured else "-"
        base, cand = f"{e.baseline:.4f}", _candidate(r, f"{e.candidate:.4f}")
        return [rule, verdict, base, cand, f"{e.delta:+.4f}" if measured else "-", bounds, f"Δ ≥ −{e.margin}"]
    if isinstance(r, PerplexityResult):
        bounds = f"[{e.lower_bound:.4f}, {e.upper_bound:.4f}]" if measured else "-"
        base, cand = f"{e.baseline_perplexity:.3f}", _candidate(r, f"{e.candidate_perplexity:.3f}")
        return [rule, verdict, base, cand, f"×{e.ratio:.4f}" if measured else "-", bounds, f"ratio ≤ {e.max_ratio}"]
    limit = f"≤ {e.max}" if e.max is not None else f"≥ {e.min}"
    bounds = f"[{e.lower_bound:.4f}, {e.upper_bound:.4f}]" if measured else "-"
    return [rule, verdict, "-", _candidate(r, f"{e.value:.4f}"), "-", bounds, limit]


def render_markdown(v: Verdict) -> str:
    """The verdict for a CI job summary or a model card: the headline, a table of rules, how far a sequential
    gate went, the notes and the provenance (identities, golden set, versions). Every name and note is escaped
    (quantize/tables.py): a policy or rule name makes no headline, table row or tag."""
    p = v.provenance
    lines = [f"### quantize gate {md_code(v.policy)}: {HEADLINE[v.verdict]}{fails_closed(v)}", ""]
    head = ["rule", "verdict", "baseline", "candidate", "change", "one-sided bounds", "passes when"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_row(r)) + " |" for r in v.rules]
    sq = v.sequential
    if sq is not None:
        scored, total = sum(sq.items_scored.values()), sum(sq.items_total.values())
        taken = f"{sq.looks_taken} of {len(sq.looks)} looks"
        lines += ["", f"Sequential: {taken}, {scored:,} of {total:,} candidate items scored."]
    if v.notes:
        lines += [""] + [f"- note: {md_text(n)}" for n in v.notes]
    b, c = p.baseline.checkpoint, p.candidate.checkpoint
    lines += [
        "",
        f"Baseline `{b.identity_sha256[:12]}`, candidate `{c.identity_sha256[:12]}` (checkpoint identities over "
        f"weights, config and tokenizer); golden set {md_code(f'{p.golden.name}/{p.golden.version}')} "
        f"(`{p.golden.manifest_sha256[:12]}`), suite {md_code(p.suite)}, lm-eval {md_text(p.lm_eval_version)}, "
        f"seed {p.seed}.",
    ]
    lines += [f"The {line}." for line in computed_on(p, md_text)]
    return "\n".join(lines) + "\n"


def computed_on(p: VerdictProvenance, escape: Callable[[str], str] = printable) -> list[str]:
    """Where each side's numbers were computed, for a side that names its machine (an activation-rounding model
    on a CPU); `escape` makes the CPU's name safe for the output (text or Markdown)."""
    return [
        f"{name} was computed on {escape(s.cpu)} at {counted(s.threads or 0, 'thread')}: it rounds its activations, "
        "and its numbers move with the CPU and the thread count (docs/results.md)"
        for name, s in (("baseline", p.baseline), ("candidate", p.candidate))
        if s.cpu is not None
    ]
