"""`quantize sweep` as text: one row per candidate, then what the sweep wrote. Names the sweep file chose (the
candidates', the rules', the paths) and the messages that quote them are printed through tables.py (`text_table`,
`printable`): on one line, every control character shown as its escape; a candidate's message keeps its own line
breaks, each line after its first marked as its continuation (`printable_lines`: "Run:" and the command under it)."""

from __future__ import annotations

from quantize.records import SweepPlan, SweepRecord
from quantize.sweep.spec import SweepSpec
from quantize.tables import printable, printable_lines, text_table

SHOWN = {"pass": "PASS", "rejected": "REJECTED", "inconclusive": "INCONCLUSIVE", None: "-"}


def sweep_text(r: SweepRecord) -> str:
    home = SweepSpec.model_validate(r.resolved).home
    rows = []
    for c in r.candidates:
        verdict = SHOWN[c.verdict] if c.exit_code in (0, 1) else f"exit {c.exit_code}"
        rows.append(
            [
                c.name,
                f"{c.bits_per_weight:.3f}" if c.bits_per_weight is not None else "-",
                verdict,
                f"{c.wall_seconds:.0f} s" if c.wall_seconds is not None else "-",
                ", ".join(c.nodes) or "-",
            ]
        )
    lines = [text_table(rows, ["candidate", "bits/weight", "verdict", "wall", "node"]), ""]
    for c in r.candidates:
        if c.failed_rules:
            lines.append(printable(f"{c.name}: {', '.join(c.failed_rules)}"))
        if c.exit_code > 1:
            lines.append(printable(f"{c.name} (exit {c.exit_code}): ") + printable_lines(c.message))
    scored = [s for t in r.tasks for s in t.scored if t.kind == "baseline"]
    retried = sum(max(0, len(t.attempts) - 1) for t in r.tasks)
    lines += [
        f"{len(r.tasks)} tasks on {len(r.nodes)} node(s) in {r.wall_seconds:.0f} s"
        + (f"; {retried} retried after their worker died" if retried else "")
        + ("; the baseline scored once" if scored else "; the baseline's scores from the cache" if r.tasks else ""),
        printable(f"wrote {home}/sweep.json" + (f" and the report {r.report}/report.md" if r.report else "")),
        *map(printable, r.notes),
    ]
    return "\n".join(line for line in lines if line is not None)


def plan_text(p: SweepPlan) -> str:
    """`quantize sweep FILE --plan`: each candidate, what it still needs and its folder; then the tasks."""
    rows = [
        [
            c.name,
            c.todo,
            c.checkpoint or "-",
            ", ".join(f"{k}={v}" for k, v in c.matrix.items()) if c.matrix else "-",
        ]
        for c in p.candidates
    ]
    lines = [text_table(rows, ["candidate", "to do", "folder", "matrix cell"]), ""]
    lines += [
        printable(f"{c.name} (refused, exit 2): ") + printable_lines(c.message)
        for c in p.candidates
        if c.todo == "refused"
    ]
    lines += [
        printable(f"{c.name} ({c.todo}): ") + printable_lines(c.message)
        for c in p.candidates
        if "gate" in c.todo and c.message
    ]
    tasks = [
        [t.task, ", ".join(t.after) or "-", ", ".join(f"{k}={v}" for k, v in t.resources.items())] for t in p.tasks
    ]
    if tasks:
        lines += ["", text_table(tasks, ["task", "after", "resources"])]
    lines += [
        "",
        f"{len(p.candidates)} candidates, {len(p.tasks)} tasks on {p.address}; policy {p.policy}, baseline "
        f"{p.baseline}; the sweep's files in {p.home} (nothing was run or written)",
    ]
    return "\n".join(lines)
