"""A sweep matrix over a field whose values are words YAML 1.1 reads as booleans (`streaming: [on, off]`): each
cell is the recipe the word names, planned without Ray (the project's YAML loader reads YAML 1.2's booleans)."""

from __future__ import annotations

import json

from quantize.cli import main as cli
from quantize.convert.recipe import parse_recipe
from quantize.sweep.plan import candidates
from quantize.sweep.spec import load_sweep


def test_a_matrix_of_streaming_on_and_off_is_two_valid_cells(lab, no_cluster, capsys):
    import yaml

    f = lab.sweep(matrix=f"  recipes: [{lab.w4}]\n  fields: {{streaming: [on, off], offload: [auto]}}\n")
    found = candidates(load_sweep(f)[0])
    assert [(c.name, c.error) for c in found] == [
        ("w4-streaming=on-offload=auto", None),
        ("w4-streaming=off-offload=auto", None),
    ]
    assert [c.cell for c in found] == [{"streaming": "on", "offload": "auto"}, {"streaming": "off", "offload": "auto"}]
    written = [parse_recipe(yaml.safe_load(c.recipe_text)) for c in found]  # the cell's recipe, as its task reads it
    assert [r.streaming.value for r in written] == ["on", "off"]
    assert cli(["sweep", str(f), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["todo"]) for c in plan["candidates"]] == [(c.name, "convert and gate") for c in found]
    assert not (lab.base / "out").exists()  # planning writes nothing
