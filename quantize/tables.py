"""Tables as text: aligned columns for the terminal, pipes for Markdown. The one table formatter."""

from __future__ import annotations

import html
import re
from typing import Any


def text_table(rows: list[list[Any]], header: list[str]) -> str:
    """Columns padded to their widest cell: the first left-aligned, the rest right-aligned. Each cell on one line
    (`printable`): a name holding a newline or a terminal escape shows it, and starts no row of its own."""
    cells = [[printable(c) for c in header]] + [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub Markdown table whose cells are plain text, each escaped (`md_text`): a cell shows what it holds."""
    return "\n".join(
        ["| " + " | ".join(md_text(c) for c in header) + " |", "|" + "---|" * len(header)]
        + ["| " + " | ".join(md_text(c) for c in r) + " |" for r in rows]
    )


# --- Escaping what people read ------------------------------------------------------------------------------
# Names come from users (policy, rule, task and checkpoint names, paths) and land in Markdown (a CI job summary, a
# model card, the report), HTML (the report), XML (JUnit) and the terminal. Each writer escapes through these few
# functions, so that a name holding "\n# PASS", "<script>" or "|" shows as those characters, never as a headline,
# a tag or a table cell.

# C0 and C1 controls (newline, tab, ESC, NUL, ...), Unicode's line and paragraph separators, and the bidirectional
# overrides and isolates (text that displays in another order than it reads)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Markdown's inline syntax: code, emphasis, links and images, raw HTML and entities, tables, strikethrough, headings
_MD_INLINE = re.compile(r"([\\`*_\[\]<>&|~!#])")
_MD_LINE_START = re.compile(r"^(\s*)(?:([-+=])|(\d+)([.)]))")  # lists, setext underlines, ordered lists


def printable(text: object) -> str:
    """`text` on one line with every control character written as its escape (`\\n`, `\\x1b`, `\\u202e`): what a
    name holds is shown, and it can start no new line, move no cursor and reorder no text."""

    def esc(m: re.Match[str]) -> str:
        c = m.group()
        return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")

    return _CONTROL.sub(esc, str(text))


CONTINUED = "  | "  # what starts each line after a message's first (printable_lines)


def printable_lines(text: object) -> str:
    """A message written on several lines (a command to run on a line of its own) with its line breaks kept: each
    line `printable`, every line after the first starting with CONTINUED, so the message reads as written while no
    line of it, a planted name's "\n# PASS" included, starts at the margin, where a row or a progress line would."""
    first, *rest = str(text).rstrip("\n").split("\n")
    return "\n".join([printable(first), *(CONTINUED + printable(line) for line in rest)])


def md_text(text: object) -> str:
    """`text` as Markdown that renders as exactly these characters (CommonMark and GitHub's): on one line
    (`printable`), with every character that could start markup backslash-escaped (pipes included: a table cell)."""
    s = _MD_INLINE.sub(r"\\\1", printable(text))
    if m := _MD_LINE_START.match(s):  # a list item, an ordered list or a setext underline where the text starts
        s = f"{s[: m.end() - 1]}\\{s[m.end() - 1 :]}"
    return s


def md_code(text: object) -> str:
    """`text` as a Markdown code span: on one line (`printable`), fenced by one backtick more than the longest run
    inside it, and padded where it starts or ends with a backtick or a space (which the span would eat); "" for "".
    Inside a table, `markdown_cell` escapes its pipes as GitHub's tables require."""
    s = printable(text)
    if not s:
        return ""  # Markdown has no empty code span
    fence = "`" * (max((len(run) for run in re.findall("`+", s)), default=0) + 1)
    pad = " " if s.strip(" ") and (s[0] in "` " or s[-1] in "` ") else ""  # spaces only: kept as they are
    return f"{fence}{pad}{s}{pad}{fence}"


def markdown_cell(cell: str) -> str:
    """A code span (`md_code`) or our own Markdown as a table cell, its pipes escaped: GitHub ends a cell at any pipe
    not preceded by a backslash, inside code spans too, and drops that backslash. (`md_text` escapes its own.)"""
    return cell.replace("|", "\\|")


def html_text(text: object) -> str:
    """`text` for HTML text or a quoted attribute: on one line (`printable`), `& < > " '` as entities."""
    return html.escape(printable(text), quote=True)


def html_code(text: object) -> str:
    """`text` as an HTML <code> element (`html_text` inside)."""
    return f"<code>{html_text(text)}</code>"


def counted(n: int, noun: str) -> str:
    """`n` of a noun whose plural adds an s: "1 thread", "2 threads"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def first_named(names: list[str], shown: int = 5) -> str:
    """Names a message lists, the first `shown` of them and how many more: "a, b, c, d, e and 3 more"."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
