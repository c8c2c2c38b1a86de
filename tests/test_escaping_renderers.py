"""Names a user or a checkpoint chose, printed by the sweep's and the search's text and written into a conversion's
model card, go through tables.py's escaping (issue 41): a planted name holding a newline, a pipe, backticks and
`<script>` shows as those characters, starts no line, row or heading of its own, and adds no table cell."""

from __future__ import annotations

import re

import pytest

from quantize import records
from quantize.records import (
    AllocationRecord,
    CandidateRecord,
    RunRecord,
    SearchReport,
    SweepRecord,
    TryRecord,
    UnitRecord,
)

PLANTED = "evil|name`x`<script>\n# PASS"


def _lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith(prefix)]


def test_sweep_text_keeps_a_planted_name_on_its_line():
    from quantize.sweep.render import sweep_text
    from quantize.tables import CONTINUED

    cand = CandidateRecord(
        name=PLANTED,
        source="r.yaml",
        checkpoint=None,
        bits_per_weight=None,
        verdict="rejected",
        failed_rules=[f"rule {PLANTED}"],
        exit_code=3,
        message=f"failed: {PLANTED}",
        wall_seconds=None,
        nodes=[],
    )
    r = SweepRecord.model_construct(
        resolved={"policy": "gates/ci.yaml", "recipes": ["r.yaml"], "output": "/tmp/out", "name": "s"},
        candidates=[cand],
        tasks=[],
        nodes=[],
        wall_seconds=1.0,
        report=None,
        notes=[f"note {PLANTED}"],
    )
    text = sweep_text(r)
    assert not _lines_starting(text, "# PASS")  # before: a line "# PASS" of its own, per place the name went
    # shown as its characters: the row, the rules' line (name and rule), the message's name, the note
    assert text.count("evil|name`x`<script>\\n# PASS") == 5
    # the message keeps its line breaks (tables.printable_lines), its next line marked as its continuation
    assert f"failed: evil|name`x`<script>\n{CONTINUED}# PASS" in text


def test_a_refusal_written_on_several_lines_reads_as_written_in_the_sweeps_text(tmp_path, monkeypatch, capsys):
    """The default model's refusal ("... Run:" and the commands on lines of their own, checkpoint/loader.py) in the
    sweep's table text and its progress line: each line of it on a line, marked as the message's continuation.
    Before, both printed a literal "Run:\\n    pip install ..." (a review's repro)."""
    from quantize.checkpoint.loader import resolve_model
    from quantize.cluster.executor import say_to_stderr
    from quantize.errors import UsageError
    from quantize.sweep.render import sweep_text
    from quantize.tables import CONTINUED

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "empty"))
    with pytest.raises(UsageError) as e:
        resolve_model(None)
    said = str(e.value)
    want = [f"{CONTINUED}{line}" for line in said.splitlines()[1:]]
    assert len(want) >= 2
    cand = CandidateRecord(
        name="q8",
        source="r.yaml",
        checkpoint=None,
        bits_per_weight=None,
        verdict=None,
        failed_rules=[],
        exit_code=2,
        message=said,
        wall_seconds=None,
        nodes=[],
    )
    r = SweepRecord.model_construct(
        resolved={"policy": "p.yaml", "recipes": ["r.yaml"], "output": "/tmp/out", "name": "s"},
        candidates=[cand],
        tasks=[],
        nodes=[],
        wall_seconds=0.0,
        report=None,
        notes=[],
    )
    say_to_stderr("sweep")(f"refused   q8 (exit 2): {said}")
    for text, first in ((sweep_text(r), "q8 (exit 2): "), (capsys.readouterr().err, "quantize sweep: refused   q8")):
        assert "\\n" not in text
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(first))
        assert lines[at].endswith(said.splitlines()[0]) and lines[at + 1 : at + 1 + len(want)] == want


def _search_report(name: str) -> SearchReport:
    alloc = AllocationRecord(
        label=f"try {name}",
        bytes=1,
        bits_per_weight=4.0,
        predicted_kl=0.1,
        holdout_kl=0.2,
        holdout_top1=None,
        options={name: 1},
        allocation={name: name},
    )
    return SearchReport.model_construct(
        spec=f"spec {name}",
        budgets_bits=[4.5],
        smallest_bits_per_weight=4.0,
        sensitivity_seconds=1.0,
        items={"sensitivity": 3, "holdout": 3},
        units=[UnitRecord(name=name, parameters=1, bytes={"w4": 1}, kl={"w4": 0.5, "keep": 0.0})],
        comparisons=[alloc],
        tries=[
            TryRecord(
                allocation=alloc,
                gated=True,
                checkpoint=None,
                true_bytes=None,
                verdict="rejected",
                failed_rules=[name],
            )
        ],
        result=None,
        drivers=[name],
    )


def test_search_text_keeps_a_planted_name_on_its_line():
    from quantize.search.render import search_text

    text = search_text(_search_report(PLANTED))
    assert not _lines_starting(text, "# PASS")
    assert "evil|name`x`<script>\\n# PASS" in text.splitlines()[0]  # the spec's path, on the first line
    assert text.count("<script>\\n# PASS") == 7  # spec, layer group, 2 labels, options, failed rule, drivers


@pytest.fixture(scope="module")
def run_record(tmp_path_factory, tiny_model) -> RunRecord:
    import quantize
    from quantize.convert.recipe import parse_recipe

    out = tmp_path_factory.mktemp("card") / "rtn8"
    recipe = parse_recipe({"name": "rtn8", "model": str(tiny_model), "method": "rtn", "scheme": "W8A16"})
    return records.read(RunRecord, quantize.run(recipe, output=out).output / "quantize.json")


def test_the_conversion_s_model_card_escapes_the_names_it_shows(run_record):
    """The recipe's name (or the model folder's, its fallback) is the card's heading; the calibration's description
    and the recorded versions are table cells. Before, a planted name made a heading "# PASS", raw HTML, and a table
    row with an extra cell."""
    from quantize.convert.card import model_card

    rec = run_record.model_copy(
        update={
            "recipe": run_record.recipe.model_copy(
                update={"resolved": {**run_record.recipe.resolved, "name": PLANTED}}
            ),
            "versions": {**run_record.versions, "quantize": PLANTED},
            "method": "rtn",
        }
    )
    card = model_card(rec, None)
    body = card.split("---", 2)[2]
    assert not _lines_starting(body, "# PASS") and "<script>" not in body
    assert r"evil\|name\`x\`\<script\>\\n\# PASS" in body  # shown as its characters (md_text)
    heading = next(line for line in body.splitlines() if line.startswith("# "))
    assert heading == r"# evil\|name\`x\`\<script\>\\n\# PASS"
    rows = [line for line in body.splitlines() if line.startswith("| ")]
    assert rows and all(len(re.findall(r"(?<!\\)\|", row)) == 3 for row in rows)  # two cells, every row
