"""The Python API (quantize/api.py, re-exported by `quantize`): each command as a function returning the record
the CLI prints, bad input as the CLI's UsageError, and importing it costs no heavy library."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import yaml

import quantize
from quantize import records
from quantize.convert.recipe import parse_recipe
from quantize.golden.build import Sizes
from quantize.records import RunRecord, ScoreDoc, Verdict

from conftest import ROOT, small_golden, suite_file

SIZES = Sizes(facts=24, cloze=12, analogy=6, kv=9, prose=4, smoke=3)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-api"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("api")
    golden = small_golden(base, SIZES)
    suite = suite_file(base / "suite.yaml", golden)
    policy = base / "gate.yaml"
    policy.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.1}}\n  - {{agreement: kl, max: 0.5}}\n"
    )
    return base, suite, policy


def test_importing_quantize_loads_no_heavy_library():
    heavy = "('torch', 'transformers', 'lm_eval', 'ray')"
    code = f"import sys, quantize; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_run_from_a_file_and_from_an_object_gives_the_record_it_wrote(tmp_path, tiny_model):
    data = {"name": "rtn8", "model": str(tiny_model), "method": "rtn", "scheme": "W8A16", "group_size": 64}
    path = tmp_path / "rtn8.yaml"
    path.write_text(yaml.safe_dump({**data, "output": str(tmp_path / "from-file")}))
    done = quantize.run(path)
    assert done.output == tmp_path / "from-file"
    assert done.record == records.read(RunRecord, done.output / "quantize.json")
    assert done.record.bits.bits_per_weight == pytest.approx(quantize.inspect(done.output).bits_per_weight)
    obj = quantize.run(parse_recipe(data), output=tmp_path / "from-object")
    assert obj.record.recipe.path == "<python>" and obj.record.recipe.sha256 == obj.record.recipe.resolved_sha256
    assert obj.record.bits.total_bytes == done.record.bits.total_bytes


def test_bad_input_raises_the_clis_usage_error(tmp_path, tiny_model):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model: {tiny_model}\nmethod: rtn\nscheme: W9A16\n")
    with pytest.raises(quantize.UsageError, match="scheme"):
        quantize.run(bad)
    with pytest.raises(quantize.UsageError, match="path or a Recipe"):
        quantize.run(42)
    with pytest.raises(quantize.UsageError, match="hardware 'tpu' is unknown"):
        quantize.decode_cost(tiny_model, hardware="tpu")
    with pytest.raises(quantize.UsageError, match="x 'bits' is not an axis"):
        quantize.write_report([tiny_model], tmp_path / "report", x="bits")


def test_score_and_gate_return_the_records_the_cli_prints(setup, tiny_model, tmp_path):
    _, suite, policy = setup
    doc = quantize.score(suite, tiny_model)
    assert isinstance(doc, ScoreDoc) and doc.tasks["core_facts"].items
    junit = tmp_path / "gate.xml"
    v = quantize.gate(policy, tiny_model, tiny_model, junit=junit)
    assert isinstance(v, Verdict) and v.verdict == "pass" and v.exit_code == 0
    assert "testcase" in junit.read_text()
    rtn = quantize.run(
        parse_recipe({"name": "rtn8", "model": str(tiny_model), "method": "rtn", "scheme": "W8A16", "group_size": 64}),
        output=tmp_path / "rtn8",
    )
    results = quantize.agree(suite, tiny_model, [tiny_model, rtn.output])  # the baseline itself is left out
    assert [c for c, _ in results] == [rtn.output] and 0 <= results[0][1].kl_mean < 0.5


def test_decode_cost_and_report(setup, tiny_model, tmp_path):
    cost = quantize.decode_cost(tiny_model)
    assert cost.checkpoint is not None and cost.formats and cost.kv_bytes_per_sequence > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = quantize.write_report([tiny_model], tmp_path / "report", suite=setup[1])
    assert (tmp_path / "report" / "report.md").is_file() and data


def test_the_examples_in_docs_api_name_only_what_exists():
    """Every Python block of docs/api.md compiles, and every `quantize.NAME` it calls is part of the API."""
    import ast
    import re

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    called = set()
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "quantize":
                called.add(node.attr)
    assert called <= set(quantize.__all__), called - set(quantize.__all__)
    assert set(quantize.api.__all__) - {"Converted", "CacheKey"} <= called  # every function has an example
