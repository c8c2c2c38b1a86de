"""Escaping what people read (quantize/tables.py): a name shows as its own characters in Markdown and HTML, on one
line, whatever it holds; checked by rendering with a CommonMark parser (markdown-it-py, GitHub's table extension on)
where it is installed, and on the text itself where it is not."""

from __future__ import annotations

import html
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantize.tables import (
    first_named,
    html_code,
    html_text,
    markdown_cell,
    markdown_table,
    md_code,
    md_text,
    printable,
)

NASTY = [
    "ok\n# PASS",
    "<script>alert(1)</script>",
    "a | b | c",
    "`tick` and ``two``",
    "`",
    "1. first",
    "- item",
    "+ item",
    "=====",
    "*bold* _it_ ~~gone~~ [link](http://x) ![img](x.png)",
    "&amp; &#35; &lt;",
    "back\\slash \\| \\`",
    "nul\x00esc\x1b[31mred\u202eevil\u2028sep\r\ttab",
    "> quote",
    "### heading",
]


def _md():
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").enable("table").enable("strikethrough")


def test_printable_keeps_text_on_one_line_and_shows_each_control_character():
    assert printable("a\nb\tc\x00d\x1be\u202ef\u2028g") == "a\\nb\\tc\\x00d\\x1be\\u202ef\\u2028g"
    assert printable("plain — ünïcode 中文 ✅") == "plain — ünïcode 中文 ✅"


@pytest.mark.parametrize("text", NASTY)
def test_md_text_renders_as_its_own_characters(text):
    rendered = _md().render(md_text(text))
    assert rendered.startswith("<p>") and rendered.count("<p>") == 1 and rendered.endswith("</p>\n")
    assert html.unescape(rendered[3:-5]) == printable(text)


@pytest.mark.parametrize("text", NASTY)
def test_md_code_is_one_code_span_of_its_own_characters(text):
    rendered = _md().render(f"x {md_code(text)} y")
    m = re.fullmatch(r"<p>x <code>(.*)</code> y</p>\n", rendered, re.S)
    assert m and html.unescape(m.group(1)) == printable(text)


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(codec="utf-8"), min_size=1, max_size=40))
def test_any_name_is_one_code_span_and_one_table_cell(text):
    md = _md()
    table = md.render(f"| name | other |\n|---|---|\n| {markdown_cell(md_code(text))} | {md_text(text)} |\n")
    cells = re.findall(r"<td>(.*?)</td>", table, re.S)
    assert len(cells) == 2 and cells[0].startswith("<code>") and cells[0].endswith("</code>")
    assert html.unescape(cells[0][6:-7]) == printable(text)
    assert html.unescape(cells[1]) == printable(text).strip()  # a cell's own white space is trimmed


def test_markdown_table_escapes_every_cell():
    rows = [["a | b", "<b>x</b>"], ["# PASS", "`c`"]]
    out = markdown_table(["name | x", "value"], rows)
    assert len(out.splitlines()) == 4
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 3 for line in out.splitlines())
    rendered = _md().render(out)
    assert "<b>" not in rendered and "<h1>" not in rendered and rendered.count("<td>") == 4


def test_html_helpers_escape_markup_and_quotes():
    assert html_text('<a href="x">\n') == "&lt;a href=&quot;x&quot;&gt;\\n"
    assert html_code("<script>") == "<code>&lt;script&gt;</code>"


def test_first_named_lists_five_names_then_how_many_more():
    assert first_named(["a", "b", "c", "d", "e"]) == "a, b, c, d, e"
    assert first_named(list("abcdefg")) == "a, b, c, d, e and 2 more"
    assert first_named(["x"]) == "x" and first_named(list("abc"), shown=2) == "a, b and 1 more"
