"""`quantize search` as text: sensitivities, the equal-bytes comparison, the gated frontier and the result. Names
the spec or the checkpoint chose (the spec's path, layer groups, options, rules, the result's folder) are printed
through tables.py (`text_table`, `printable`): on one line, every control character shown as its escape."""

from __future__ import annotations

from quantize.records import AllocationRecord, SearchReport
from quantize.tables import printable
from quantize.tables import text_table as table


def search_text(r: SearchReport) -> str:
    def opts(a: AllocationRecord) -> str:
        return ", ".join(f"{n} {o}" for o, n in sorted(a.options.items()))

    lines = [
        f"search {printable(r.spec)}: {len(r.units)} layer groups, sensitivity on {r.items['sensitivity']} agreement "
        f"items ({r.sensitivity_seconds:.0f} s to measure, kept in the cache), checks on {r.items['holdout']} "
        "held-out items; smallest model "
        f"{r.smallest_bits_per_weight:.3f} bits/weight, budget {', '.join(f'{b:g}' for b in r.budgets_bits)}",
        "",
        "most sensitive layer groups (mean KL, alone):",
    ]
    top = sorted(r.units, key=lambda u: -max(u.kl.values()))[:8]
    lines.append(
        table(
            [[u.name, *[f"{u.kl[o]:.4f}" for o in sorted(u.kl) if o != "keep"]] for u in top],
            ["layer group", *[o for o in sorted(top[0].kl) if o != "keep"]],
        )
    )
    if r.comparisons:
        rand = [c.holdout_kl for c in r.comparisons if c.label.startswith("random") and c.holdout_kl is not None]
        mean = f"; random allocations: mean {sum(rand) / len(rand):.4f} over {len(rand)}" if rand else ""
        lines += ["", f"at equal bytes (held-out mean KL{mean}):"]
        lines.append(
            table(
                [
                    [c.label, f"{c.bits_per_weight:.3f}", f"{c.predicted_kl:.4f}", _kl(c.holdout_kl), opts(c)]
                    for c in r.comparisons
                ],
                ["allocation", "bits/weight", "predicted KL", "held-out KL", "options"],
            )
        )
    lines += ["", "frontier (cheapest first; gated by bisection, the largest first):"]
    rows = []
    for t in r.tries:
        a = t.allocation
        top1 = "-" if a.holdout_top1 is None else f"{a.holdout_top1:.3f}"
        verdict = t.verdict.upper() if t.verdict else t.note
        rows.append(
            [
                a.label,
                f"{a.bits_per_weight:.3f}",
                _kl(a.holdout_kl),
                top1,
                verdict,
                ", ".join(t.failed_rules) or "-",
            ]
        )
    lines.append(table(rows, ["allocation", "bits/weight", "held-out KL", "top-1", "verdict", "failed rules"]))
    if r.result:
        lines.append(f"\nresult: {printable(r.result)} (quantize.json and search.json there)")
    else:
        drivers = printable(", ".join(r.drivers))
        lines.append(f"\nno allocation within the budget passed; the most damaging layer groups: {drivers}")
    return "\n".join(lines)


def _kl(kl: float | None) -> str:
    """A held-out KL, or "-" where no held-out items were measured (measure.holdout_per_task: 0)."""
    return "-" if kl is None else f"{kl:.4f}"
