"""Tables as text: aligned columns for the terminal, pipes for Markdown. The one table formatter."""

from __future__ import annotations

from typing import Any


def text_table(rows: list[list[Any]], header: list[str]) -> str:
    """Columns padded to their widest cell: the first left-aligned, the rest right-aligned."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    return "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    )
