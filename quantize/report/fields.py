"""The report's section by recipe field: for each field whose value differs among the candidates (a sweep matrix's
varied fields, or whatever else sets the recipes apart), the candidates grouped by its value, with their verdicts
and bytes, as a table and a plot per field.

Fields come from the resolved recipe each candidate's quantize.json records: a field counts when every candidate
with a recipe has it and it takes two values or more (the recipe's name, output and model never count). More than
MAX_FIELDS such fields (candidates from unrelated recipes) is no grouping to read: the section is left out.
"""

from __future__ import annotations

import json
from typing import Any

from quantize.report.collect import Entry

MAX_FIELDS = 8
SKIP = {"name", "output", "model", "description"}
VERDICTS = ("pass", "rejected", "inconclusive")


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if not prefix and k in SKIP:
            continue
        if isinstance(v, dict) and v:
            out |= _flat(v, f"{path}.")
        else:
            out[path] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return out


def varied_fields(entries: list[Entry]) -> dict[str, dict[str, list[Entry]]]:
    """Field -> value (as text) -> its candidates, in the candidates' order; {} when there is nothing to group."""
    cands = [(e, _flat(e.recipe)) for e in entries if not e.is_baseline and e.recipe is not None]
    if len(cands) < 2:
        return {}
    common = set.intersection(*(set(f) for _, f in cands))
    varied = [k for k in cands[0][1] if k in common and len({f[k] for _, f in cands}) > 1]
    if not varied or len(varied) > MAX_FIELDS:
        return {}
    return {k: _grouped([(e, f[k]) for e, f in cands]) for k in varied}


def _grouped(pairs: list[tuple[Entry, str]]) -> dict[str, list[Entry]]:
    groups: dict[str, list[Entry]] = {}
    for e, v in pairs:
        groups.setdefault(v, []).append(e)
    try:  # numbers in their order, else as first met
        return dict(sorted(groups.items(), key=lambda kv: float(kv[0])))
    except ValueError:
        return groups


def _verdict(e: Entry) -> str | None:
    return e.verdict.verdict if e.verdict is not None else None


def field_rows(fields: dict[str, dict[str, list[Entry]]]) -> tuple[list[str], list[list[str]]]:
    head = ["field", "value", "candidates", "pass", "rejected", "inconclusive", "not gated", "bytes", "of"]
    rows = []
    for field, groups in fields.items():
        for value, es in groups.items():
            counts = [sum(_verdict(e) == v for e in es) for v in VERDICTS]
            sizes = sorted(e.total_bytes for e in es)
            span = f"{sizes[0]:,}" if sizes[0] == sizes[-1] else f"{sizes[0]:,} – {sizes[-1]:,}"
            rows.append(
                [field, value, str(len(es)), *map(str, counts), str(len(es) - sum(counts)), span]
                + [", ".join(e.label for e in es)]
            )
    return head, rows


def fields_figure(fields: dict[str, dict[str, list[Entry]]]) -> Any:
    """The figure of fields.png (the renderer saves it): one panel per field, its values along x, each candidate's
    MiB up, coloured by verdict; None when no field varies."""
    if not fields:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = {"pass": "tab:green", "rejected": "tab:red", "inconclusive": "tab:orange", None: "tab:gray"}
    fig, axes = plt.subplots(1, len(fields), figsize=(4.2 * len(fields), 3.6), squeeze=False)
    for ax, (field, groups) in zip(axes.flat, fields.items(), strict=True):
        for x, es in enumerate(groups.values()):
            for k, e in enumerate(es):
                dx = (k - (len(es) - 1) / 2) * 0.08
                ax.scatter(x + dx, e.total_bytes / 2**20, color=colour[_verdict(e)], s=30)
        ax.set_xticks(range(len(groups)), [v[:24] for v in groups], fontsize=7, rotation=20)
        ax.set_title(field, fontsize=9)
        ax.set_ylabel("MiB of stored tensors", fontsize=8)
        ax.grid(alpha=0.3)
        ax.margins(x=0.2, y=0.2)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=v or "not gated") for v, c in colour.items()]
    fig.legend(handles=handles, fontsize=7, loc="upper right")
    fig.suptitle("Verdict and size against each recipe field that varies", fontsize=9)
    fig.tight_layout()
    return fig
