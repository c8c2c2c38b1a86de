"""The bytes-versus-accuracy report: Pareto plots, bytes by role, the table, decode-cost bounds.

Writes DIR/report.md, DIR/report.html (self-contained: images embedded as base64, no JavaScript,
no network) and the plots as PNG and SVG.
"""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from quantize.errors import UsageError
from quantize.io import atomic_dir, read_user_file, unwritable_parent
from quantize.kinds import KINDS, headline, kind_of
from quantize.records import (
    VERDICT_FILE,
    AccuracyResult,
    AgreementMetric,
    AgreementRuleResult,
    PerplexityResult,
    TaskScores,
    UntestedResult,
    Verdict,
    finite_or_named,
)
from quantize.report.collect import Entry
from quantize.report.fields import field_rows, fields_figure, varied_fields
from quantize.tables import counted, html_code, html_text, markdown_table, md_code, md_text

ROLE_ORDER = [
    ("payload", "packed payload"),
    ("scale", "scales"),
    ("zero_point", "zero points"),
    ("group_index", "group indices"),
    ("quant_meta", "other quant. metadata"),
    ("kv_scale", "KV-cache scales"),
    ("embedding", "embeddings"),
    ("lm_head", "lm_head"),
    ("linear_kept", "linears kept 16-bit"),
    ("norm", "norms"),
    ("bias", "biases"),
    ("state", "state-space parameters"),
    ("conv", "convolution kernels"),
    ("scalar", "per-head and per-layer scalars"),
    ("other", "other"),
]


def pareto_front(points: list[tuple[float, float]], higher_is_better: bool = True) -> list[int]:
    """Indices of the points no other point dominates (fewer or equal bytes and a better or equal score,
    strictly better in one), ordered by bytes."""
    sign = 1 if higher_is_better else -1
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (x2 <= x and sign * y2 >= sign * y) and (x2 < x or sign * y2 > sign * y)
            for j, (x2, y2) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def spread_labels(ys: list[float], gap: float) -> list[float]:
    """Label heights as close as possible to ys (least squares) with neighbours at least `gap` apart,
    in the same order: isotonic regression (pool adjacent violators) of y_k − k·gap over the sorted ys."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    blocks: list[list[float]] = []  # [sum, count] of pooled values
    for k, i in enumerate(order):
        blocks.append([ys[i] - k * gap, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    z = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
    out = [0.0] * len(ys)
    for k, i in enumerate(order):
        out[i] = z[k] + k * gap
    return out


def label_positions(xs: list[float], ys: list[float], x_near: float, gap: float) -> list[float]:
    """Label heights: points closer than x_near in x share a column of labels, spread `gap` apart."""
    heights = list(ys)
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and xs[i] - xs[groups[-1][-1]] < x_near:
            groups[-1].append(i)
        else:
            groups.append([i])
    for g in groups:
        for i, h in zip(g, spread_labels([ys[i] for i in g], gap), strict=True):
            heights[i] = h
    return heights


def metrics(entries: list[Entry]) -> list[tuple[str, str, bool]]:
    """(key, label, higher is better) of every metric some entry has."""
    tasks: dict[str, str] = {}
    for e in entries:
        for t, d in (e.scores.tasks if e.scores else {}).items():
            tasks[t] = d.output_type
    out = [
        (f"{t}:acc", f"{t} accuracy", True) if KINDS[ot].right_wrong else (f"{t}:bpb", f"{t} bits per byte", False)
        for t, ot in sorted(tasks.items())
    ]
    if any(e.agreement for e in entries):
        out.append(("agreement:kl", "mean KL vs baseline (lower bound)", False))
    return out


def task_scores(e: Entry, task: str) -> TaskScores | None:
    return e.scores.tasks.get(task) if e.scores else None


def value(e: Entry, key: str) -> tuple[float, float] | None:
    """(value, standard error) of a metric for an entry, or None when it was not scored."""
    kind = key.partition(":")[0]
    if kind == "agreement":
        if e.is_baseline:
            return (0.0, 0.0)
        a = e.agreement
        return (a.kl_mean, a.kl_se) if a and math.isfinite(a.kl_mean) and math.isfinite(a.kl_se) else None
    d = task_scores(e, kind)
    if d is None:
        return None
    h = headline(d)  # a NaN item's task has no figure to plot (its cell says so)
    return (h.value, h.se or 0.0) if math.isfinite(h.value) else None


def x_of(e: Entry, axis: str) -> float:
    return e.total_bytes / 2**20 if axis == "bytes" else (e.bits_per_weight or 0.0)


def _save(fig: object, out: Path, stem: str) -> list[str]:
    import matplotlib.pyplot as plt

    for ext in ("png", "svg"):
        fig.savefig(out / f"{stem}.{ext}", dpi=130)
    plt.close(fig)
    return [f"{stem}.png", f"{stem}.svg"]


def plot_pareto(entries: list[Entry], out: Path, axis: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = metrics(entries)
    if not ms:
        return []
    cols = min(3, len(ms))
    rows = -(-len(ms) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    xlabel = "total tensor size (MiB)" if axis == "bytes" else "true bits per weight (whole model)"
    for ax, (key, label, hib) in zip(axes.flat, ms, strict=False):
        pts = [(x_of(e, axis), v, e) for e in entries if (v := value(e, key)) is not None]
        if not pts:
            ax.text(0.5, 0.5, "no finite figure", ha="center", va="center", fontsize=8, transform=ax.transAxes)
        for x, (y, se), e in pts:
            ax.errorbar(
                x,
                y,
                yerr=se or None,
                fmt="*" if e.is_baseline else "o",
                ms=12 if e.is_baseline else 6,
                color="black" if e.is_baseline else "tab:blue",
                capsize=3,
            )
        front = pareto_front([(x, y) for x, (y, _), _ in pts], hib)
        if len(front) > 1:
            ax.plot(
                [pts[i][0] for i in front],
                [pts[i][1][0] for i in front],
                "--",
                color="tab:orange",
                lw=1,
                label="Pareto frontier",
            )
        _annotate(
            ax,
            [(x, y, e.label + (" (baseline)" if e.is_baseline else "")) for x, (y, _), e in pts],
            [b for _, (y, se), _ in pts for b in (y - se, y + se)],  # the error bars' ends bound the span
        )
        ax.set_title(label + (" ↑" if hib else " ↓"), fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.margins(x=0.15, y=0.2)
        if len(front) > 1:
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(ms) :]:
        ax.axis("off")
    fig.suptitle(
        "Quality against size\n(★ baseline; error bars: ± 1 SE; ↑ higher is better, ↓ lower is better)", fontsize=9
    )
    fig.tight_layout()
    return _save(fig, out, PLOTS[0])


def plot_bytes(entries: list[Entry], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.55 * len(entries) + 1.6))
    labels = [e.label + (" (baseline)" if e.is_baseline else "") for e in entries]
    left = [0.0] * len(entries)
    cmap = plt.get_cmap("tab20")
    for k, (role, name) in enumerate(ROLE_ORDER):
        widths = [e.bytes_by_role.get(role, 0) / 2**20 for e in entries]
        if any(widths):
            ax.barh(labels, widths, left=left, label=name, color=cmap(k))
            left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, e in enumerate(entries):
        ax.text(
            left[i],
            i,
            f"  {e.total_bytes / 2**20:.1f} MiB, {e.bits_per_weight:.2f} b/w" if e.bits_per_weight else "",
            va="center",
            fontsize=7,
        )
    ax.set_xlabel("MiB of stored tensors")
    ax.set_title("Where the bytes go", fontsize=10)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.35)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return _save(fig, out, PLOTS[1])


def _gate_cell(e: Any) -> str:
    """The verdict; without scores, the policy's agreement rules alone (labelled so)."""
    if e.verdict:
        return e.verdict.verdict.upper()
    if e.agreement_outcome:
        word = {"regression": "REJECTED", "pass": "pass", "inconclusive": "inconclusive"}[e.agreement_outcome]
        return f"agreement {word}; scores pending"
    return "no verdict"


def _f(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


# --- the gate's evidence: the saved verdict's rules, as cells, a table and points with intervals ------------------


def verdict_source(e: Entry) -> str:
    """Where the gate cell's verdict came from, or why a gate.json beside the checkpoint is not it."""
    v = e.verdict
    stale = f"{VERDICT_FILE} not shown: {e.verdict_stale}" if e.verdict_stale else ""
    if v is not None and e.verdict_origin == "saved":
        sq = v.sequential
        design = "fixed design" if sq is None else f"staged: {sq.looks_taken} of {len(sq.looks)} looks"
        return f"saved verdict ({VERDICT_FILE}, {design})"
    if v is not None:
        return "; ".join(x for x in ["recomputed from cached full scores (fixed design)", stale] if x)
    withheld = f"not decided from the cached scores: {e.verdict_withheld}" if e.verdict_withheld else ""
    return "; ".join(x for x in [stale, withheld] if x) or "-"


def rule_tasks(entries: list[Entry]) -> set[str]:
    """Tasks some entry's verdict judged (an accuracy or perplexity rule): columns even where nothing is cached."""
    return {r.task for e in entries if e.verdict for r in e.verdict.rules if not isinstance(r, AgreementRuleResult)}


def _items_of(v: Verdict, task: str, n: int) -> str:
    """'n/N': items the rule's evidence rests on, of the task's items (N known for a staged gate)."""
    total = v.sequential.items_total.get(task) if v.sequential else None
    return f"{n:,}/{total:,}" if total is not None else f"{n:,}"


def _staged_n(v: Verdict | None, task: str, n: int) -> str:
    """', n n/N' after a table cell's Δ when the verdict was staged (its Δ rests on a sample, not on the scores)."""
    return f", n {_items_of(v, task, n)}" if v is not None and v.sequential is not None else ""


def evidence_cell(v: Verdict | None, task: str) -> str | None:
    """A task's cell from the verdict alone (no cached scores: a staged gate): the first rule on the task's change
    with the gate's bounds at its decision and the items it rests on; None when no rule judged the task."""
    r = next((r for r in (v.rules if v else []) if not isinstance(r, AgreementRuleResult) and r.task == task), None)
    if v is None or r is None:
        return None
    if isinstance(r, UntestedResult):
        return "untested (the gate stopped before this task)"
    if r.non_finite:  # NaN items or evidence: the change measured over them is no figure
        return f"non-finite ({r.non_finite})"
    e = r.evidence
    if isinstance(r, AccuracyResult):
        return f"Δ {e.delta:+.3f} [{e.lower_bound:+.3f}, {e.upper_bound:+.3f}], n {_items_of(v, task, e.n)}"
    return f"ppl ×{e.ratio:.3f} [{e.lower_bound:.3f}, {e.upper_bound:.3f}], n {_items_of(v, task, e.n)}"


@dataclass(frozen=True)
class RulePoint:
    """One rule's evidence for one checkpoint: the measured change with the gate's bounds at its decision."""

    rule: str
    kind: str  # accuracy (Δ), perplexity (ratio), agreement (the metric's value)
    label: str  # the checkpoint's
    total_bytes: int
    bits_per_weight: float | None
    value: float
    lower: float
    upper: float
    limit: float  # −margin, max_ratio, or the agreement rule's max or min
    reference: float  # the baseline's own value on this scale: Δ 0, ratio 1, KL 0, top-1 and Σ min(p, q) 1
    outcome: str
    n: int
    items_total: int | None  # of the task's items (a staged gate's plan); None where not recorded
    look: str  # "look 2 of 4", "agreement look 1 of 4", "fixed design"
    source: str  # verdict_source of the entry


def _look(v: Verdict, r: AccuracyResult | PerplexityResult | AgreementRuleResult) -> str:
    sq = v.sequential
    if sq is None or r.look is None:
        return "fixed design" if sq is None else "measured once"
    return f"{'agreement ' if isinstance(r, AgreementRuleResult) else ''}look {r.look} of {len(sq.looks)}"


def rule_point(e: Entry, r: AccuracyResult | PerplexityResult | AgreementRuleResult) -> RulePoint:
    """The rule's measured change and bounds; NaN (no point, "non-finite" in the table) where the gate marked its
    evidence non-finite: a change over NaN log-likelihoods (lm-eval's argmax picks the first choice) is no figure."""
    p = _rule_point(e, r)
    return replace(p, value=math.nan, lower=math.nan, upper=math.nan) if r.non_finite else p


def _rule_point(e: Entry, r: AccuracyResult | PerplexityResult | AgreementRuleResult) -> RulePoint:
    v = e.verdict
    assert v is not None
    ev = r.evidence
    common = dict(
        rule=r.rule,
        label=e.label,
        total_bytes=e.total_bytes,
        bits_per_weight=e.bits_per_weight,
        lower=ev.lower_bound,
        upper=ev.upper_bound,
        outcome=r.verdict if r.non_finite is None else f"{r.verdict} ({r.non_finite})",
        look=_look(v, r),
        source=verdict_source(e),
    )
    if isinstance(r, AccuracyResult):
        total = v.sequential.items_total.get(r.task) if v.sequential else r.evidence.n
        return RulePoint(
            kind="accuracy",
            value=r.evidence.delta,
            limit=-r.evidence.margin,
            reference=0.0,
            n=r.evidence.n,
            items_total=total,
            **common,
        )
    if isinstance(r, PerplexityResult):
        total = v.sequential.items_total.get(r.task) if v.sequential else r.evidence.n
        return RulePoint(
            kind="perplexity",
            value=r.evidence.ratio,
            limit=r.evidence.max_ratio,
            reference=1.0,
            n=r.evidence.n,
            items_total=total,
            **common,
        )
    a = r.evidence
    limit = a.max if a.max is not None else a.min
    assert limit is not None
    return RulePoint(
        kind="agreement",
        value=a.value,
        limit=limit,
        reference=0.0 if r.metric is AgreementMetric.kl else 1.0,
        n=a.items,
        items_total=None,
        **common,
    )


def rule_points(entries: list[Entry]) -> list[RulePoint]:
    """Every tested rule of every candidate's verdict (saved or recomputed), in the entries' order."""
    return [
        rule_point(e, r)
        for e in entries
        if e.verdict is not None and not e.is_baseline
        for r in e.verdict.rules
        if not isinstance(r, UntestedResult)
    ]


def evidence_rows(points: list[RulePoint]) -> tuple[list[str], list[list[str]]]:
    """The evidence section's table: one row per candidate and rule."""
    head = ["checkpoint", "rule", "outcome", "change", "bounds at the decision", "passes when", "items", "look"]
    fmt = {"accuracy": "+.4f", "perplexity": ".4f", "agreement": ".4f"}
    rows = []
    for p in points:
        f = fmt[p.kind]
        change = {"accuracy": "Δ ", "perplexity": "ratio ×"}.get(p.kind, "") + format(p.value, f)
        bounds = f"[{format(p.lower, f)}, {format(p.upper, f)}]"
        if math.isnan(p.value):
            change, bounds = "non-finite", "-"
        passes = (
            f"Δ ≥ {p.limit:g}"
            if p.kind == "accuracy"
            else f"ratio ≤ {p.limit:g}"
            if p.kind == "perplexity"
            else f"{'≤' if p.reference == 0.0 else '≥'} {p.limit:g}"
        )
        items = f"{p.n:,}" + (f" of {p.items_total:,}" if p.items_total is not None else "")
        rows.append([p.label, p.rule, p.outcome, change, bounds, passes, items, p.look])
    return head, rows


OUTCOME_COLOUR = {"pass": "tab:green", "regression": "tab:red", "inconclusive": "tab:orange"}


def _n_of(p: RulePoint) -> str:
    return f"{p.n:,}" + (f"/{p.items_total:,}" if p.items_total is not None else "")


def _annotate(ax: Any, labels: list[tuple[float, float, str]], heights: list[float]) -> None:
    """Labels to the right of their points; labels of points at about the same size spread apart; `heights` (with
    the points) bound the vertical span. The Pareto and the evidence plots label theirs with it."""
    if not labels:  # a panel with no finite figure (every entry's non-finite: its cells say so)
        return
    xs, ys = [a for a, _, _ in labels], [b for _, b, _ in labels]
    lo, hi = min(ys + heights), max(ys + heights)
    x_span, y_span = (max(xs) - min(xs)) or 1.0, (hi - lo) or 1.0
    for (x, y, text), h in zip(labels, label_positions(xs, ys, 0.06 * x_span, 0.075 * y_span), strict=True):
        moved = abs(h - y) > 0.01 * y_span
        ax.annotate(
            text,
            (x, y),
            xytext=(x + 0.03 * x_span, h),
            ha="left",
            va="center",
            fontsize=7,
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5"} if moved else None,
        )


def plot_evidence(entries: list[Entry], points: list[RulePoint], out: Path, axis: str) -> list[str]:
    """One panel per rule: each gated candidate's measured change against its size, with the gate's bounds at its
    decision as the error bar, the rule's limit dashed and the baseline (★) at no change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = list(dict.fromkeys(p.rule for p in points if math.isfinite(p.value)))
    if not rules:
        return []
    base = next((e for e in entries if e.is_baseline), None)
    cols = min(3, len(rules))
    rows = -(-len(rules) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    xlabel = "total tensor size (MiB)" if axis == "bytes" else "true bits per weight (whole model)"

    def x(p: RulePoint | Entry) -> float:
        return p.total_bytes / 2**20 if axis == "bytes" else (p.bits_per_weight or 0.0)

    for ax, rule in zip(axes.flat, rules, strict=False):
        pts = [p for p in points if p.rule == rule and math.isfinite(p.value)]
        for p in pts:
            lo = p.value - p.lower if math.isfinite(p.lower) else 0.0
            hi = p.upper - p.value if math.isfinite(p.upper) else 0.0
            ax.errorbar(
                x(p),
                p.value,
                yerr=[[max(lo, 0.0)], [max(hi, 0.0)]],
                fmt="o",
                ms=6,
                capsize=3,
                color=OUTCOME_COLOUR.get(p.outcome, "tab:blue"),
            )
        labels = [(x(p), p.value, f"{p.label} ({p.outcome}, n {_n_of(p)})") for p in pts]
        if base is not None:
            ax.plot([x(base)], [pts[0].reference], "*", ms=12, color="black")
            labels.append((x(base), pts[0].reference, base.label + " (baseline)"))
        _annotate(ax, labels, [v for p in pts for v in (p.lower, p.upper, p.limit) if math.isfinite(v)])
        ax.axhline(pts[0].reference, color="0.6", lw=0.8)
        ax.axhline(pts[0].limit, color="tab:red", lw=1, ls="--", label=f"limit {pts[0].limit:g}")
        kind = pts[0].kind
        ax.set_ylabel(
            {"accuracy": "Δ candidate − baseline", "perplexity": "perplexity ratio"}.get(kind, kind), fontsize=8
        )
        ax.set_title(rule, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.margins(x=0.35, y=0.15)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(rules) :]:
        ax.axis("off")
    fig.suptitle(
        "The gate's evidence against size\n(each rule's measured change; error bars: the gate's bounds at its decision;"
        "\ngreen pass, orange inconclusive, red regression; n of N items)",
        fontsize=9,
    )
    fig.tight_layout()
    return _save(fig, out, PLOTS[2])


def table_rows(entries: list[Entry]) -> tuple[list[str], list[list[str]]]:
    tasks = sorted({t for e in entries for t in (e.scores.tasks if e.scores else {})} | rule_tasks(entries))
    batch = next((e.decode.batch for e in entries if e.decode and e.decode.batch is not None), None)
    head = ["recipe", "method", "scheme", "bits/w (model)", "bits/w (q-linears)", "MiB"]
    head += [t.removeprefix("core_") for t in tasks]
    head += [
        "mean KL",
        "top-1",
        "α as draft",
        "gate",
        "verdict from",
        "batch-1 bound ms",
        f"batch-{batch} bound ms",
        "spec. speedup (γ=4)",
    ]
    rows = []
    for e in entries:
        r = [
            e.label + (" (baseline)" if e.is_baseline else ""),
            e.method,
            e.scheme,
            _f(e.bits_per_weight, ".3f"),
            _f(e.qlinear_bits, ".3f"),
            f"{e.total_bytes / 2**20:.1f}",
        ]
        for t in tasks:
            d = task_scores(e, t)
            if d is None:
                r.append(evidence_cell(e.verdict, t) or "not scored")
            elif (h := headline(d)).non_finite:
                r.append(h.text())
            elif not kind_of(d).right_wrong:
                r.append(f"{h.value:.4f} bpb")
            else:
                # the rule on the figure shown (acc; a generation task's exact_match), not acc_norm's beside it
                ev = e.verdict.accuracy_evidence(t, ("acc", "exact_match")) if e.verdict else None
                delta = f" (Δ {ev.delta:+.3f}, LB {ev.lower_bound:+.3f}{_staged_n(e.verdict, t, ev.n)})" if ev else ""
                se = f" ± {h.se:.3f}" if h.se is not None else ""
                r.append(f"{h.value:.3f}{se}{delta}")
        a = e.agreement
        r += [
            ("0" if e.is_baseline else _f(a and a.kl_mean, ".4f")),
            ("1" if e.is_baseline else _f(a and a.top1, ".3f")),
            ("-" if e.is_baseline else _f(a and a.sum_min, ".3f")),
            ("baseline" if e.is_baseline else _gate_cell(e)),
            ("-" if e.is_baseline else verdict_source(e)),
            _f(e.decode.batch1_ms if e.decode else None, ".3f"),
            _f(e.decode.batch_ms if e.decode else None, ".3f"),
            _f(e.decode.speculative_speedup if e.decode else None, ".2f"),
        ]
        rows.append(r)
    return head, rows


PLOTS = ("pareto", "bytes", "evidence", "fields")  # each written as STEM.png and STEM.svg (_save)
REPORT_FILES = frozenset(
    {"report.md", "report.html", "report.json", *(f"{s}.{x}" for s in PLOTS for x in ("png", "svg"))}
)


# the keys of report.json (_write): a file of other content is no report this tool wrote
REPORT_KEYS = frozenset({"table", "entries", "images", "evidence", "fields"})
MAX_REPORT_JSON_BYTES = 2**28  # a report of thousands of checkpoints: megabytes


def _is_report_json(path: Path) -> bool:
    """Whether `path` is a report.json this tool wrote: a regular file (not a link), a JSON object of exactly the
    keys _write writes, its table a head and rows, its entries and images lists."""
    try:
        data = json.loads(read_user_file(path, "report.json", MAX_REPORT_JSON_BYTES, follow_links=False))
    except (UsageError, OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(data, dict)
        and data.keys() == REPORT_KEYS
        and isinstance(data["table"], dict)
        and data["table"].keys() == {"head", "rows"}
        and isinstance(data["entries"], list)
        and isinstance(data["images"], list)
    )


def check_target(target: Path) -> None:
    """Before anything is read: `--out` can take a report. It names a folder (not `.` or `..`), is not a link, its
    first existing parent is a writable folder, and where it exists it is an empty folder or an earlier report,
    recognised by its content: a report.json that reads as the report record this tool writes (_is_report_json),
    and every other entry a regular file of the report's own names (REPORT_FILES), since the whole folder is
    replaced. A folder that also holds a user's files is refused (a report.md among them was taken as proof of a
    report, and the folder replaced with everything in it), and so is one of a report's names alone (the user's
    own report.md of notes was replaced: a review). io.check_output_file keeps the same rule for one file (the
    gate's JUnit and verdict)."""
    target = Path(target)
    if target.name in ("", ".", "..") or target.resolve() == Path.cwd().resolve():
        raise UsageError(f"--out {target} is not a folder the report can replace; name a new folder (--out report)")
    if target.is_symlink():
        raise UsageError(f"--out {target} is a link; name the folder itself, or a new folder")
    if target.exists():
        if not target.is_dir():
            raise UsageError(f"--out {target} is a file; name a new folder (an earlier report folder is replaced)")
        with os.scandir(target) as found:
            entries = list(found)
        other = sorted(e.name for e in entries if e.name not in REPORT_FILES or not e.is_file(follow_symlinks=False))
        if other:
            raise UsageError(
                f"--out {target} holds files that are not an earlier report's ({', '.join(other[:5])}"
                f"{', ...' if len(other) > 5 else ''}), and the report replaces the whole folder; choose a new folder"
            )
        if entries and not _is_report_json(target / "report.json"):
            names = ", ".join(sorted(e.name for e in entries)[:5])
            raise UsageError(
                f"--out {target} holds {names} but no report.json this tool wrote (a JSON object of the report's "
                "keys), so it is not an earlier report, and the report replaces the whole folder; choose a new "
                "folder (or move those files away)"
            )
        return
    if (parent := unwritable_parent(target)) is not None:
        raise UsageError(f"--out {target}: {parent} is not a writable folder; choose another --out")


def write_report(entries: list[Entry], target: Path, axis: str, suite: str, hardware: str) -> dict[str, Any]:
    """Write the report folder atomically; an existing folder is replaced only if it holds an earlier report's
    files alone (check_target, which the caller ran before collecting and which runs again here)."""
    import matplotlib

    check_target(target)
    # names are users' text: a `$` in one is a dollar sign, not matplotlib's mathtext (which could also fail to parse)
    with matplotlib.rc_context({"text.parse_math": False}), atomic_dir(target, replace=True) as out:
        return _write(entries, out, axis, suite, hardware)


def _computed_on(e: Entry) -> tuple[str, int] | None:
    """The CPU and thread count an entry's scores (else its saved verdict's candidate side) name, if any."""
    side = e.scores.provenance if e.scores else e.verdict.provenance.candidate if e.verdict else None
    if side is None or side.cpu is None or side.threads is None:
        return None
    return side.cpu, side.threads


def _notes(entries: list[Entry], hardware: str, context: int | None, code: Callable[[object], str]) -> list[str]:
    """The notes under the table, names and commands as `code` (md_code or html_code: escaped either way)."""
    decode_note = (
        f"Decode cost: lower bounds on {code(hardware)} from each checkpoint's measured bytes ({code('quantize cost')} "
        f"model, {context:,}-token contexts), not measurements. The speculative speedup uses the measured Σ min(p, q) "
        "as α, γ = 4 and c = candidate bytes / baseline bytes (a bandwidth-bound draft step), with free verification."
        if context
        else "Decode cost: not computable (no checkpoint's config.json gives its KV layout)."
    )
    unbounded = [code(e.label) for e in entries if e.decode and e.decode.not_computable]
    if unbounded and context:
        decode_note += (
            f" No bounds for {', '.join(unbounded)}: the KV layout is not known from the config.json or the GGUF "
            f"header (why: report.json, each entry's {code('decode.not_computable')})."
        )
    notes = [decode_note]
    if stale := [code(e.label) for e in entries if e.record_stale]:
        notes.append(
            f"Not the output its {code('quantize.json')} describes (it records other weights than the folder holds), "
            f"so its recipe fields are not shown: {', '.join(stale)}."
        )
    if missing := [code(e.label) for e in entries if not e.scores]:
        notes.append(f"Not scored (no cached {code('quantize eval')} result for this suite): {', '.join(missing)}.")
    if sampled := [code(e.label) for e in entries if not e.scores and e.verdict and e.verdict.sequential]:
        notes.append(
            f"Gated in stages, so not scored in full: {', '.join(sampled)}. Their task cells hold the gate's own "
            "evidence, Δ candidate − baseline [the gate's bounds at its decision], n of N items (the sample it "
            "scored of the task's items); the gate's evidence section plots them against size."
        )
    computed = [(e.label, on) for e in entries if (on := _computed_on(e))]
    machines = [f"{code(label)} on {code(cpu)} at {counted(n, 'thread')}" for label, (cpu, n) in computed]
    if machines:
        notes.append(
            "Activation-rounding checkpoints, whose numbers move with the CPU and torch's thread count "
            f"(docs/results.md): {', '.join(machines)}."
        )
    if agreed := [e for e in entries if e.agreement and not e.scores and not e.verdict]:
        notes.append(
            f"Measured without scoring ({code('quantize agree')}): token-distribution agreement with the baseline on "
            f"{agreed[0].agreement.positions:,} positions of the golden prompts (mean KL, a lower bound; top-1; "
            f"Σ min(p, q)) for {', '.join(code(e.label) for e in agreed)}. Accuracy, perplexity and the gate's "
            f"verdict need scores: {code('quantize gate POLICY --baseline B --candidate C')} "
            f"({code('make gate-all')}). Their gate cell is the policy's agreement rules alone: 'agreement REJECTED' "
            "already settles a rejection; 'agreement pass' leaves the accuracy and perplexity rules to the full gate."
        )
    return notes


def _write(entries: list[Entry], out: Path, axis: str, suite: str, hardware: str) -> dict[str, Any]:
    points = rule_points(entries)
    images = plot_pareto(entries, out, axis) + plot_bytes(entries, out) + plot_evidence(entries, points, out, axis)
    fields = varied_fields(entries)
    images += _save(fig, out, PLOTS[3]) if (fig := fields_figure(fields)) is not None else []
    by_field = field_rows(fields)
    head, rows = table_rows(entries)
    context = next((e.decode.context for e in entries if e.decode and e.decode.context is not None), None)
    md = ["# Bytes versus accuracy\n", f"Suite {md_code(suite)}; {len(entries)} checkpoints.", ""]
    if "pareto.png" in images:
        md += ["![Pareto plots](pareto.png)", ""]
    md += ["![Bytes by role](bytes.png)", "", markdown_table(head, rows)]  # every cell escaped
    for note in _notes(entries, hardware, context, md_code):
        md += ["", note]
    if fields:
        md += ["", "## By recipe field", "", "![Verdict and size against each field](fields.png)", ""]
        md += [FIELDS_TEXT, "", markdown_table(*by_field)]
    evidence = evidence_section(entries, points, images)
    md += evidence_markdown(*evidence)
    (out / "report.md").write_text("\n".join(md) + "\n")

    def img(name: str, alt: str) -> str:
        data = base64.b64encode((out / name).read_bytes()).decode()
        return f'<img alt="{alt}" src="data:image/png;base64,{data}" style="max-width:100%">'

    cells = lambda r, tag: "".join(f"<{tag}>{html_text(c)}</{tag}>" for c in r)  # noqa: E731
    body = [f"<h1>Bytes versus accuracy</h1><p>Suite {html_code(suite)}; {len(entries)} checkpoints.</p>"]
    if "pareto.png" in images:
        body.append(img("pareto.png", "Pareto plots of quality against size"))
    body.append(img("bytes.png", "Stacked bars of bytes by role"))
    body.append(
        "<table><thead><tr>"
        + cells(head, "th")
        + "</tr></thead><tbody>"
        + "".join("<tr>" + cells(r, "td") + "</tr>" for r in rows)
        + "</tbody></table>"
    )
    body += [f"<p>{note}</p>" for note in _notes(entries, hardware, context, html_code)]
    if fields:
        body += ["<h2>By recipe field</h2>", img("fields.png", "Verdict and size against each field")]
        body += [f"<p>{html_text(FIELDS_TEXT)}</p>", "<table><thead><tr>" + cells(by_field[0], "th") + "</tr></thead>"]
        body += ["<tbody>" + "".join("<tr>" + cells(r, "td") + "</tr>" for r in by_field[1]) + "</tbody></table>"]
    body += evidence_html(*evidence, img)
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,th:first-child{text-align:left}"
    )
    (out / "report.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>quantize report</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )
    data = {"table": {"head": head, "rows": rows}, "entries": [_entry_json(e) for e in entries], "images": images}
    data["evidence"] = [asdict(p) for p in points]
    data["fields"] = {"head": by_field[0], "rows": by_field[1]}
    # strict JSON: a NaN or infinity (a broken candidate's figures) as its name, as the evidence records write it
    (out / "report.json").write_text(json.dumps(finite_or_named(data), indent=2, default=str, allow_nan=False) + "\n")
    return data


FIELDS_TEXT = (
    "Each recipe field whose value differs among the candidates (a sweep matrix's varied fields), the candidates "
    "grouped by its value: how many the policy passed, rejected or left inconclusive (not gated: no saved or "
    "recomputed verdict), and their bytes (every stored tensor)."
)


def evidence_section(
    entries: list[Entry], points: list[RulePoint], images: list[str]
) -> tuple[list[str], tuple[list[str], list[list[str]]], bool]:
    """The evidence section's paragraphs, its table and whether it has a plot (evidence.png)."""
    if not points and not any(e.verdict_stale for e in entries):
        return [], ([], []), False
    sources = [f"{e.label}: {verdict_source(e)}" for e in entries if not e.is_baseline and verdict_source(e) != "-"]
    text = [
        "Each gated candidate's rules as its gate measured them: the change (Δ candidate − baseline for accuracy, "
        "the perplexity ratio, the agreement metric), the gate's bounds at its decision (one-sided at α; for a "
        "staged gate at the look that decided it, or the last one taken, with that look's critical value) and the "
        "items they rest on (n of the task's N for a staged gate, which scores a sample). A saved verdict "
        f"({VERDICT_FILE} beside the checkpoint, "
        "checked against this report's policy and both checkpoints' identities as they are now, and held by the "
        "cache as a gate's own decision) is shown as saved; one decided here from cached full scores is labelled "
        f"recomputed (fixed design); a {VERDICT_FILE} that no longer matches, or that no gate decided with this "
        "cache, is never shown as the verdict.",
        "Verdicts from: " + "; ".join(sources) + ".",
    ]
    return text, evidence_rows(points), "evidence.png" in images


def evidence_markdown(text: list[str], table: tuple[list[str], list[list[str]]], plot: bool) -> list[str]:
    if not text:
        return []
    md = ["", "## The gate's evidence", ""]
    if plot:
        md += ["![The gate's evidence against size](evidence.png)", ""]
    md += [md_text(text[0]), "", md_text(text[1])]  # labels are users' names: escaped
    return md + (["", markdown_table(*table)] if table[1] else [])


def evidence_html(text: list[str], table: tuple[list[str], list[list[str]]], plot: bool, img: Any) -> list[str]:
    if not text:
        return []
    body = ["<h2>The gate's evidence</h2>"]
    if plot:
        body.append(img("evidence.png", "Each rule's measured change with the gate's bounds against size"))
    body += [f"<p>{html_text(t)}</p>" for t in text]
    if table[1]:
        row = lambda r, tag: "".join(f"<{tag}>{html_text(c)}</{tag}>" for c in r)  # noqa: E731
        body.append(
            "<table><thead><tr>"
            + row(table[0], "th")
            + "</tr></thead><tbody>"
            + "".join("<tr>" + row(r, "td") + "</tr>" for r in table[1])
            + "</tbody></table>"
        )
    return body


def _entry_json(e: Entry) -> dict[str, Any]:
    """An entry for report.json: its records as their own JSON (task summaries without per-item records)."""
    return {
        **{
            k: ((v.to_data() if v else {}) if k == "decode" else v)
            for k, v in e.__dict__.items()
            if k not in ("scores", "agreement", "verdict")
        },
        "scores": e.scores.summary() if e.scores else None,
        "agreement": e.agreement.model_dump() if e.agreement else None,
        "verdict": e.verdict.model_dump() if e.verdict else None,
    }
