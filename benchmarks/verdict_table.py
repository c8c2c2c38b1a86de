"""A Markdown table of saved verdicts (`quantize gate ... --json` files, as make gate-these writes beside each
checkpoint): bits per weight from each checkpoint's quantize.json, every rule's change, the verdict and the rules
that decided it (its regressions and inconclusive rules; an untested rule decided nothing).

    python benchmarks/verdict_table.py outputs/fp8-kv/gate.json outputs/nvfp4/gate.json ...

Columns: accuracy rules as Δ in points with the one-sided bounds' lower end, perplexity rules as the ratio,
agreement rules as their value; "decided by" lists the rules that were not a pass (for a pass: none). The bits
come from the candidate's quantize.json (whole model, quantized linear layers); a candidate without one shows "-".
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cell(r) -> str:
    from quantize.records import AccuracyResult, PerplexityResult, UntestedResult

    if isinstance(r, UntestedResult):
        return "untested"
    e = r.evidence
    if isinstance(r, AccuracyResult):
        return f"{100 * e.delta:+.1f} (LB {100 * e.lower_bound:+.1f})"
    if isinstance(r, PerplexityResult):
        return f"×{e.ratio:.3f}"
    return f"{e.value:.3f}"


def main(paths: list[str]) -> int:
    from quantize import records
    from quantize.records import RunRecord, Verdict

    rows, head = [], None
    for p in map(Path, paths):
        v = records.read(Verdict, p)
        names = [r.rule for r in v.rules]
        head = head or names
        if names != head:
            sys.exit(f"{p}: rules {names} differ from the first file's {head}: one policy per table")
        meta = p.parent / "quantize.json"
        bits = "- | -"
        if meta.is_file():
            b = records.read(RunRecord, meta).bits
            q = b.quantized_linear_bits_per_weight
            bits = f"{b.bits_per_weight:.3f} | {q:.3f}" if q else f"{b.bits_per_weight:.3f} | -"
        decided = ", ".join(f"{r.rule} ({r.verdict})" for r in v.rules if r.verdict not in ("pass", "untested"))
        decided = decided or "none"
        rows.append(
            f"| {p.parent.name} | {bits} | " + " | ".join(cell(r) for r in v.rules) + f" | {v.verdict} | {decided} |"
        )
    print("| checkpoint | bits/w whole | bits/w q. linears | " + " | ".join(head or []) + " | verdict | decided by |")
    print("|" + "---|" * (5 + len(head or [])))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
