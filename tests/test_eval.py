"""`quantize eval` and `quantize gate` end to end on a tiny seeded model and a tiny golden set:
per-item records, the cache, agreement, A/A passes (also at another batch size), and a
too-small set yields 'inconclusive', never a pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantize.cli import main
from quantize.evaluate.score import score
from quantize.golden.build import Sizes, build_core
from test_golden import make_sources

SIZES = Sizes(facts=24, cloze=12, analogy=6, kv=9, prose=4, smoke=3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("eval")
    build_core(make_sources(base / "src"), base / "golden" / "v1", seed=3, sizes=SIZES)
    suite = base / "suite.yaml"
    suite.write_text(f"golden: {base / 'golden' / 'v1'}\nbatch_size: 4\nagreement: {{per_task: 3, top_k: 5}}\n")
    suite_b2 = base / "suite-b2.yaml"
    suite_b2.write_text(f"golden: {base / 'golden' / 'v1'}\nbatch_size: 2\nagreement: {{per_task: 3, top_k: 5}}\n")
    policy = base / "gate.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.1}}\n"
                      "  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n  - {agreement: kl, max: 0.5}\n"
                      "  - {agreement: top1, min: 0.5}\n")
    return base, suite, suite_b2, policy


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache"))


def test_eval_records_items_and_caches(setup, tiny_model):
    _, suite, _, _ = setup
    first = score(suite, tiny_model)
    assert first["cached"] is False
    tasks = first["tasks"]
    assert set(tasks) == {"core_facts", "core_cloze", "core_analogy", "core_kv", "core_prose"}
    facts = tasks["core_facts"]
    assert facts["n"] == len(facts["items"]) == 24 and facts["chance"] == pytest.approx(0.25)
    assert all(len(i["lls"]) == 4 and i["score"] in (0.0, 1.0) for i in facts["items"])
    assert all(i["ll"] < 0 and i["words"] > 100 for i in tasks["core_prose"]["items"])
    p = first["provenance"]
    assert p["golden"]["version"] == "v1" and len(p["golden"]["manifest_sha256"]) == 64
    assert p["task_versions"] == {t: 1.0 for t in tasks} and p["lm_eval_version"] and p["batch_size"] == 4
    second = score(suite, tiny_model)
    assert second["cached"] is True and second["tasks"] == first["tasks"]


def test_eval_refuses_tampered_golden(setup, tiny_model, tmp_path, capsys):
    base, _, _, _ = setup
    copy = tmp_path / "v1"
    shutil.copytree(base / "golden" / "v1", copy)
    with (copy / "data" / "facts.jsonl").open("a") as f:
        f.write('{"id": "x"}\n')
    s = tmp_path / "s.yaml"
    s.write_text(f"golden: {copy}\n")
    assert main(["eval", str(s), str(tiny_model)]) == 2
    assert "facts.jsonl" in capsys.readouterr().err


def test_gate_a_a_passes_with_agreement(setup, tiny_model, capsys):
    _, _, _, policy = setup
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "--json"])
    v = json.loads(capsys.readouterr().out)
    assert code == 0 and v["verdict"] == "pass"
    kl = next(r for r in v["rules"] if r["rule"] == "agreement kl")["evidence"]
    assert kl["value"] == pytest.approx(0, abs=1e-5) and kl["positions"] > 0
    top1 = next(r for r in v["rules"] if r["rule"] == "agreement top1")["evidence"]
    assert top1["value"] == 1.0


def test_gate_a_a_at_another_batch_size_passes(setup, tiny_model, capsys):
    _, suite, suite_b2, _ = setup
    b = score(suite, tiny_model)
    c = score(suite_b2, tiny_model)
    assert c["provenance"]["batch_size"] == 2
    for t in b["tasks"]:
        for x, y in zip(b["tasks"][t]["items"], c["tasks"][t]["items"]):
            assert x["ll"] == pytest.approx(y["ll"], abs=1e-3)
    bf, cf = Path(suite).parent / "b.json", Path(suite).parent / "c.json"
    bf.write_text(json.dumps(b))
    cf.write_text(json.dumps(c))
    pol = Path(suite).parent / "acc-only.yaml"
    pol.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.1}}\n"
                   "  - {task: core_prose, metric: perplexity, max_ratio: 1.01}\n")
    assert main(["gate", str(pol), "--baseline", str(bf), "--candidate", str(cf)]) == 0, capsys.readouterr().out


def test_damaged_model_on_a_tiny_set_is_not_a_pass(setup, tiny_model, tmp_path, capsys):
    """3-bit RTN of the tiny model against a 2-point margin: 24 facts items cannot show it, so not a pass."""
    _, suite, _, _ = setup
    policy = tmp_path / "strict.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.02}}\n  - {{agreement: kl, max: 0.5}}\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"method: rtn\nscheme: W3A16\ngroup_size: 32\ncalibration: null\nmodel: {tiny_model}\noutput: {tmp_path / 'w3'}\n")
    assert main(["run", str(recipe), "--quiet"]) == 0
    capsys.readouterr()
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(tmp_path / "w3"), "--json"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    v = json.loads(out.out)
    assert code == 1 and v["verdict"] in ("inconclusive", "rejected")
    facts = next(r for r in v["rules"] if r["rule"] == "core_facts acc")
    assert facts["verdict"] == "inconclusive" and facts["evidence"]["items_needed"] > 24
