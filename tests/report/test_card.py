"""A verdict in the candidate's model card: model-index results that huggingface_hub reads back, a human section,
both replaced (not stacked) by a later verdict, the card's own text and other results kept, and a verdict of
another checkpoint refused."""

from __future__ import annotations

import json
import shutil

import pytest
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from quantize.cli import main

from conftest import small_golden, suite_file


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    base = tmp_path_factory.mktemp("card")
    suite = suite_file(base / "suite.yaml", small_golden(base))
    p = base / "card.yaml"
    p.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 2.0}\n  - {agreement: kl, max: 0.5}\n"
    )
    return p


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-card"))


def test_gate_card_writes_model_index_that_huggingface_hub_reads_back(policy, tiny_model, tmp_path, capsys):
    cand = tmp_path / "cand"
    shutil.copytree(tiny_model, cand)
    other = EvalResult(
        task_type="text-generation",
        dataset_type="wikitext",
        dataset_name="wikitext",
        metric_type="ppl",
        metric_value=9.0,
    )
    front = ModelCardData(model_name="cand", eval_results=[other]).to_yaml()
    (cand / "README.md").write_text(f"---\n{front}\n---\n# My model\n\nMine.\n")
    args = ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand), "--json", "--card"]
    assert main(args) == 0
    verdict = json.loads(capsys.readouterr().out)
    (tmp_path / "v.json").write_text(json.dumps(verdict))
    card = ModelCard.load(cand / "README.md")
    ours = [r for r in card.data.eval_results if (r.metric_args or {}).get("source") == "quantize gate"]
    assert card.data.eval_results[0].dataset_type == "wikitext"  # the card's own results are kept
    assert [(r.task_name, r.metric_type) for r in ours] == [("core_facts", "acc"), ("core_prose", "perplexity")]
    facts = next(r for r in verdict["rules"] if r["rule"] == "core_facts acc")["evidence"]
    assert ours[0].metric_value == facts["candidate"] and ours[0].metric_args["baseline"] == facts["baseline"]
    assert (
        ours[0].dataset_name == "core/v1 core_facts"
        and ours[0].dataset_revision == verdict["provenance"]["golden"]["manifest_sha256"]
    )
    assert "Mine." in card.text and "## Quality gate: pass" in card.text and "| agreement kl | pass |" in card.text
    # a later verdict replaces the earlier one
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 0
    again = ModelCard.load(cand / "README.md")
    assert len(again.data.eval_results) == 3 and again.text.count("## Quality gate") == 1


def test_a_card_for_another_checkpoint_is_refused(policy, tiny_model, tmp_path, capsys):
    cand = tmp_path / "cand"
    shutil.copytree(tiny_model, cand)
    assert main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand), "--json"]) == 0
    (tmp_path / "v.json").write_text(capsys.readouterr().out)
    cfg = json.loads((cand / "config.json").read_text())
    (cand / "config.json").write_text(json.dumps(cfg | {"rms_norm_eps": 1e-6}))  # another checkpoint now
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 2
    assert "would claim another checkpoint's results" in capsys.readouterr().err
    assert not (cand / "README.md").exists()


def test_a_non_finite_figure_is_no_model_index_number(policy, tiny_model, tmp_path, capsys):
    """A verdict whose candidate evidence holds NaN (a regression): the section says so, the front matter gets
    no NaN value (the rule is left out of model-index)."""
    cand = tmp_path / "cand"
    shutil.copytree(tiny_model, cand)
    assert main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    facts = next(r for r in verdict["rules"] if r["rule"] == "core_facts acc")
    facts["evidence"]["candidate"] = "NaN"  # as an evidence record writes a non-finite number
    facts["verdict"], facts["non_finite"] = "regression", "candidate accuracy"
    (tmp_path / "v.json").write_text(json.dumps(verdict))
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 0
    text = (cand / "README.md").read_text()
    card = ModelCard.load(cand / "README.md")
    assert [r.task_name for r in card.data.eval_results] == ["core_prose"] and "nan" not in text.split("---")[1].lower()
    assert "| core_facts acc | regression (candidate accuracy) |" in text
