"""A sweep's `matrix:` of recipe fields, expanded before Ray: named cells, their recipes, the refusals; and the
report's grouping by recipe field."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantize.cli import main as cli
from quantize.errors import UsageError
from quantize.sweep.plan import candidates
from quantize.sweep.spec import load_sweep


def test_a_2x2_matrix_is_four_named_cells_each_a_valid_recipe_of_its_values(lab):
    from quantize.convert.recipe import parse_recipe

    f = lab.sweep(
        [lab.gptq],
        matrix=f"  recipes: [{lab.gptq}]\n  fields: {{group_size: [16, 32], calibration.samples: [8, 16]}}\n",
    )
    spec, _ = load_sweep(f)
    found = candidates(spec)
    assert [c.name for c in found] == [
        "gptq",  # the base recipe listed in `recipes:` as well: a candidate of its own
        "gptq-group_size=16-samples=8",
        "gptq-group_size=16-samples=16",
        "gptq-group_size=32-samples=8",
        "gptq-group_size=32-samples=16",
    ]
    cell = found[4]
    assert cell.error is None and cell.needs_convert and cell.checkpoint == lab.base / "out" / cell.name
    assert cell.cell == {"group_size": 32, "calibration.samples": 16}
    assert cell.recipe == str(lab.base / "out" / "sweep-t" / "recipes" / f"{cell.name}.yaml")
    import yaml

    recipe = parse_recipe(yaml.safe_load(cell.recipe_text))
    assert (recipe.name, recipe.group_size, recipe.calibration.samples) == (cell.name, 32, 16)
    assert recipe.scheme.value == "W4A16" and recipe.output is None  # the rest is the base's; the folder the sweep's
    again = candidates(load_sweep(f)[0])  # the same bytes on every plan: a cell converted before is recognised
    assert [c.recipe_sha256 for c in again] == [c.recipe_sha256 for c in found]
    assert not (lab.base / "out").exists()  # planning writes nothing


@pytest.mark.parametrize(
    "value,shown",
    [("builtin:jargon", "jargon"), ("data/chat.jsonl", "chat"), ("d/saved/", "saved"), (0.5, "0.5"), (None, "none")]
    + [(True, "true"), ([{"source": "a", "weight": 1}], "2")],
)
def test_a_value_is_named_by_what_a_reader_recognises(value, shown):
    from quantize.sweep.plan import _value_text

    assert _value_text(value, 2) == shown  # a list or mapping (a mixture) by its place among the values


def test_a_field_not_in_the_recipe_schema_is_exit_2_naming_it_before_anything_runs(lab, no_cluster, capsys):
    for field, says in [
        ("group_siz", "matrix.fields: group_siz is not a field of recipe"),
        ("calibration.sample", "matrix.fields: calibration.sample is not a field of recipe"),
        ("scheme.bits", "scheme of recipe"),
        ("name", "is the sweep's to set"),
    ]:
        f = lab.sweep(matrix=f"  recipes: [{lab.w4}]\n  fields: {{{field}: [1, 2]}}\n")
        assert cli(["sweep", str(f)]) == 2
        err = capsys.readouterr().err
        assert says in err, err
        assert not (lab.base / "out").exists()


def test_a_bad_value_is_its_cells_exit_2_and_the_other_cells_stand(lab):
    spec, _ = load_sweep(lab.sweep(matrix=f"  recipes: [{lab.w4}]\n  fields: {{scheme: [W8A16, W5A16]}}\n"))
    good, bad = candidates(spec)
    assert good.name == "w4-scheme=W8A16" and good.error is None
    assert bad.name == "w4-scheme=W5A16" and 'scheme = "W5A16"' in bad.error and bad.checkpoint is None


def test_two_cells_of_one_name_refuse_the_sweep_naming_both(lab, no_cluster, capsys):
    (lab.base / "a").mkdir()
    (lab.base / "b").mkdir()
    f = lab.sweep(matrix=f"  recipes: [{lab.gptq}]\n  fields: {{calibration.source: [a/chat.jsonl, b/chat.jsonl]}}\n")
    assert cli(["sweep", str(f)]) == 2
    err = capsys.readouterr().err
    assert 'two candidates of this sweep are named "gptq-source=chat"' in err
    assert "calibration.source='a/chat.jsonl'" in err and "calibration.source='b/chat.jsonl'" in err


@pytest.mark.parametrize(
    "field,values,twice",
    [
        ("symmetric", "[true, 1]", ("true", "1")),  # a boolean field takes 1, "yes" and "on" as true (pydantic)
        ("symmetric", '[false, true, "yes", "on"]', ("true", '"yes"')),
        ("group_size", '[16, "32", 32]', ('"32"', "32")),  # a number written as text is that number
        ("calibration.samples", '[8, "8"]', ("8", '"8"')),
    ],
)
def test_values_the_recipe_reads_alike_are_one_value_listed_twice(lab, no_cluster, capsys, field, values, twice):
    """`symmetric: [true, 1]` planned two cells converting one recipe (values were compared as YAML gives them):
    refused before anything runs, naming the field and both values, as `[32, 32.0]` is; values that differ as the
    recipe reads them (true and false) are cells of their own."""
    import yaml

    from quantize.convert.recipe import parse_recipe

    base = lab.gptq if field.startswith("calibration.") else lab.w4
    read = []
    for v in twice:  # the premise, from the recipe model itself: the two values are one recipe
        data = yaml.safe_load(base.read_text())
        leaf = data["calibration"] if field.startswith("calibration.") else data
        leaf[field.rsplit(".", 1)[-1]] = yaml.safe_load(v)
        read.append(parse_recipe(data).model_dump())
    assert read[0] == read[1]
    f = lab.sweep(matrix=f"  recipes: [{base}]\n  fields: {{{field}: {values}}}\n")
    assert cli(["sweep", str(f), "--plan"]) == 2
    err = capsys.readouterr().err
    assert f"matrix.fields: {field} lists one value twice as recipe {base} reads it ({field} {twice[0]} and " in err
    assert f"{twice[0]} and {twice[1]} are both" in err and "List each value once" in err, err
    with pytest.raises(UsageError, match="convert and gate twice"):
        candidates(load_sweep(f)[0])
    assert not (lab.base / "out").exists()


def test_values_the_recipe_reads_apart_are_cells_and_a_refused_value_is_no_duplicate(lab):
    """The duplicate is found among cells two fields deep (`symmetric` twice under each group size); true and false,
    or a value the recipe refuses beside a good one, are no duplicate."""
    f = lab.sweep(matrix=f"  recipes: [{lab.w4}]\n  fields: {{group_size: [16, 32], symmetric: [true, 1]}}\n")
    with pytest.raises(UsageError) as e:
        candidates(load_sweep(f)[0])
    assert '"w4-group_size=16-symmetric=true" and "w4-group_size=16-symmetric=1"' in str(e.value)
    assert "(symmetric true and 1 are both true)" in str(e.value)
    f = lab.sweep(matrix=f"  recipes: [{lab.w4}]\n  fields: {{symmetric: [true, false, maybe, maybe2]}}\n")
    found = candidates(load_sweep(f)[0])
    assert [c.error is None for c in found] == [True, True, False, False]


def test_a_matrix_of_too_many_cells_is_refused(lab):
    values = list(range(1, 17))
    f = lab.sweep(
        matrix=f"  recipes: [{lab.w4}]\n  fields: {{calibration.samples: {values}, calibration.seed: {values}}}\n"
    )
    assert load_sweep(f)[0].matrix.cells() == 256  # the cap: taken
    values = list(range(1, 18))
    f = lab.sweep(
        matrix=f"  recipes: [{lab.w4}]\n  fields: {{calibration.samples: {values}, calibration.seed: {values}}}\n"
    )
    with pytest.raises(UsageError, match=r"matrix has 289 cells \(1 base recipe\(s\) × 17 calibration.samples"):
        load_sweep(f)


def test_the_report_groups_candidates_by_each_varied_field(tmp_path):
    from quantize.report.collect import Entry
    from quantize.report.fields import field_rows, varied_fields

    def entry(name, group, samples, verdict, size):
        from types import SimpleNamespace

        e = Entry(name, name, "rtn", "W4A16", size, 100, None, None, {"payload": size}, name)
        e.recipe = {"name": name, "output": name, "group_size": group, "calibration": {"samples": samples, "seed": 0}}
        e.verdict = SimpleNamespace(verdict=verdict) if verdict else None
        return e

    entries = [
        entry("a", 32, 8, "pass", 1000),
        entry("b", 32, 16, "rejected", 1000),
        entry("c", 128, 8, "pass", 900),
        entry("d", 128, 16, None, 900),
    ]
    fields = varied_fields(entries)
    assert list(fields) == ["group_size", "calibration.samples"]  # name and output differ too, and never count
    head, rows = field_rows(fields)
    assert head[:7] == ["field", "value", "candidates", "pass", "rejected", "inconclusive", "not gated"]
    assert rows == [
        ["group_size", "32", "2", "1", "1", "0", "0", "1,000", "a, b"],
        ["group_size", "128", "2", "1", "0", "0", "1", "900", "c, d"],
        ["calibration.samples", "8", "2", "2", "0", "0", "0", "900 – 1,000", "a, c"],
        ["calibration.samples", "16", "2", "0", "1", "0", "1", "900 – 1,000", "b, d"],
    ]
    assert varied_fields(entries[:1]) == {}


# --- the plan, without Ray ----------------------------------------------------------------------------------

MATRIX_2X2 = "  fields: {group_size: [16, 32], scheme: [W8A16, W4A16]}\n"


def test_plan_json_of_a_2x2_matrix_is_four_named_candidates_and_the_graph_of_their_tasks(lab, no_cluster, capsys):
    import json

    import quantize

    f = lab.sweep(matrix=f"  recipes: [{lab.w4}]\n{MATRIX_2X2}")
    assert cli(["sweep", str(f), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    names = ["w4-group_size=16-scheme=W8A16", "w4-group_size=16-scheme=W4A16"]
    names += ["w4-group_size=32-scheme=W8A16", "w4-group_size=32-scheme=W4A16"]
    assert [c["name"] for c in plan["candidates"]] == names
    assert {c["todo"] for c in plan["candidates"]} == {"convert and gate"}
    assert [c["checkpoint"] for c in plan["candidates"]] == [str(lab.base / "out" / n) for n in names]
    assert plan["candidates"][3]["matrix"] == {"group_size": 32, "scheme": "W4A16"}
    tasks = {t["task"]: t for t in plan["tasks"]}
    assert sorted(tasks) == sorted(["baseline", *(f"convert {n}" for n in names), *(f"gate {n}" for n in names)])
    assert tasks[f"gate {names[0]}"]["after"] == ["baseline", f"convert {names[0]}"]
    assert tasks["baseline"]["after"] == [] and tasks[f"convert {names[0]}"]["resources"] == {"num_cpus": 1}
    assert not (lab.base / "out").exists()  # nothing written
    same = quantize.plan_sweep(f)  # the API's
    assert [c.name for c in same.candidates] == names and len(same.tasks) == 9
    assert "w4-group_size=32-scheme=W4A16  convert and gate" in _text_plan(f, capsys)


def _text_plan(f: Path, capsys) -> str:
    assert cli(["sweep", str(f), "--plan"]) == 0
    return capsys.readouterr().out


def test_the_plan_runs_where_ray_cannot_be_imported(lab):
    """`--plan` in a process where `import ray` fails: the same candidates, and the sweep itself says Ray is
    missing (exit 2), instead of a traceback."""
    import json
    import os
    import subprocess
    import sys

    f = lab.sweep(matrix=f"  recipes: [{lab.w4}]\n{MATRIX_2X2}")
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from quantize.cli import main\n"
        f"rc = main(['sweep', {str(f)!r}, '--plan', '--json'])\n"
        "assert sys.modules['ray'] is None\n"
        "raise SystemExit(rc)\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = os.environ | {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["candidates"]) == 4
    run = code.replace(", '--plan', '--json'", "")
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and "quantize sweep runs on Ray, which is not installed here" in done.stderr
    assert "Traceback" not in done.stderr


# --- a matrix on a real local cluster ------------------------------------------------------------------------


@pytest.mark.slow  # a tiny model, but nine tasks in fresh workers: 6 min on 2 loaded cores (332 s under load)
def test_a_2x2_matrix_sweep_runs_to_four_verdicts_in_sweep_json_and_the_report(lab, tmp_path, monkeypatch, capsys):
    """Done when (issue 46): a 2×2 matrix on a local Ray cluster, every cell converted and gated, each gate started
    by Ray once its conversion and the baseline were done; sweep.json and both reports group the cells by field."""
    pytest.importorskip("ray", reason="quantize sweep needs Ray: pip install 'quantize[cluster]'")
    from quantize import records
    from quantize.records import SweepRecord

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    f = lab.sweep(matrix=f"  recipes: [{lab.w4}]\n{MATRIX_2X2}", extra="cluster: {address: local, num_cpus: 2}\n")
    code = cli(["sweep", str(f)])
    rec = records.read(SweepRecord, lab.base / "out" / "sweep-t" / "sweep.json")
    assert code == rec.exit_code and code in (0, 1), capsys.readouterr().err
    by = {c.name: c for c in rec.candidates}
    assert len(by) == 4 and {c.verdict for c in by.values()} <= {"pass", "rejected", "inconclusive"}
    assert all(c.exit_code in (0, 1) and c.total_bytes and c.matrix for c in by.values())
    for g in (16, 32):  # 8-bit weights are more bytes than 4-bit ones at one group size
        assert by[f"w4-group_size={g}-scheme=W8A16"].total_bytes > by[f"w4-group_size={g}-scheme=W4A16"].total_bytes
    assert sorted(t.kind for t in rec.tasks) == ["baseline"] + ["convert"] * 4 + ["gate"] * 4
    assert {t.state for t in rec.tasks} == {"done"}
    for cell in by.values():  # each cell's recipe, as it was converted, beside the sweep's own files
        assert (lab.base / "out" / "sweep-t" / "recipes" / f"{cell.name}.yaml").is_file()
    report = (Path(rec.report) / "report.md").read_text()
    assert "## By recipe field" in report and (Path(rec.report) / "fields.png").is_file()
    for row in (
        "| group\\_size | 16 | 2 |",  # Markdown-escaped, as every name in the report
        "| group\\_size | 32 | 2 |",
        "| scheme | W8A16 | 2 |",
        "| scheme | W4A16 | 2 |",
    ):
        assert row in report, report
    folders = [c.checkpoint for c in by.values()]
    again = ["report", *folders, "--baseline", str(lab.tiny), "--policy", str(lab.policy), "--out", str(tmp_path / "r")]
    assert cli(again) == 0  # `quantize report` over the same folders: the same grouping, from the saved verdicts
    mine = (tmp_path / "r" / "report.md").read_text()

    def rows(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith(("| group\\_size |", "| scheme |"))]

    assert sorted(rows(mine)) == sorted(rows(report)) and len(rows(report)) == 4


def test_a_value_listed_twice_is_refused_as_a_recipe_would_read_them():
    """`[32, 32.0]` made two cells converting one recipe (values were compared by repr); `[true, 1]` are a boolean
    and a number, two values to the matrix alone, which knows no field's type (the plan compares them as the recipe
    reads them: test_values_the_recipe_reads_alike_are_one_value_listed_twice)."""
    from pydantic import ValidationError

    from quantize.sweep.spec import Matrix

    for twice in ([32, 32.0], ["a", "a"], [True, True], [{"x": 1}, {"x": 1.0}]):
        with pytest.raises(ValidationError, match="lists one value twice"):
            Matrix(recipes=["a.yaml"], fields={"group_size": twice})
    assert Matrix(recipes=["a.yaml"], fields={"f": [True, 1, 0.5]}).cells() == 3
