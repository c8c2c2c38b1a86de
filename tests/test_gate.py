"""The gate's decisions on synthetic per-item results: A/A passes, a planted 3-point drop is rejected with
its evidence, a too-small set is inconclusive (and fails closed), differing provenance is refused."""

from __future__ import annotations

import copy
import json
import random
import xml.etree.ElementTree as ET

import pytest
import scipy.stats as sps

from quantize.cli import main
from quantize.errors import UsageError
from quantize.gates.gate import decide, render_junit, render_text
from quantize.gates.policy import load_policy

PROV = {
    "checkpoint": {"path": "x", "weights_sha256": "a" * 64},
    "suite": {"path": "evaluate/core.yaml", "name": "core", "sha256": "s" * 64,
              "settings": {"batch_size": 16, "seed": 0, "tasks": None, "subset": None}},
    "golden": {"name": "core", "version": "v1", "path": "golden/core/v1", "manifest_sha256": "m" * 64, "task_version": 1.0},
    "task_versions": {"t_acc": 1.0, "t_prose": 1.0},
    "lm_eval_version": "0.4.13", "batch_size": 16, "seed": 0, "backend": "hf", "device": "cpu", "dtype": "float32",
}


def result(acc_scores: list[float], prose_ll: list[float], clusters: int = 50, sha: str = "a") -> dict:
    prov = copy.deepcopy(PROV)
    prov["checkpoint"]["weights_sha256"] = sha * 64
    acc_items = [{"id": f"a{i:05d}", "cluster": f"c{i % clusters}", "score": s, "ll": -1.0} for i, s in enumerate(acc_scores)]
    prose_items = [{"id": f"p{i:04d}", "cluster": f"doc{i}", "score": ll, "ll": ll, "words": 100, "bytes": 600}
                   for i, ll in enumerate(prose_ll)]
    return {"provenance": prov, "tasks": {"t_acc": {"items": acc_items}, "t_prose": {"items": prose_items}}}


def baseline(n: int = 2000, seed: int = 0) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    return [float(rng.random() < 0.6) for _ in range(n)], [-300.0 - 40 * rng.random() for _ in range(100)]


@pytest.fixture
def policy(tmp_path):
    p = tmp_path / "gates" / "p.yaml"
    p.parent.mkdir()
    p.write_text("suite: evaluate/core.yaml\nalpha: 0.05\npower: 0.8\nrules:\n"
                 "  - {task: t_acc, metric: acc, margin: 0.02}\n"
                 "  - {task: t_prose, metric: perplexity, max_ratio: 1.05}\n")
    return load_policy(p)


def test_a_a_passes(policy):
    acc, prose = baseline()
    v = decide(policy, result(acc, prose), result(acc, prose, sha="b"), None)
    assert v.verdict == "pass" and v.exit_code == 0
    assert v.rules[0].evidence["delta"] == 0 and v.rules[0].evidence["mcnemar_p"] == 1.0


def test_a_a_with_noise_like_another_batch_size_passes(policy):
    """Re-running at another batch size moves log-likelihoods by float noise; flips are rare and symmetric."""
    acc, prose = baseline()
    rng = random.Random(5)
    cand_acc = list(acc)
    for i in rng.sample(range(len(acc)), 10):
        cand_acc[i] = 1.0 - cand_acc[i]
    cand_prose = [x + rng.gauss(0, 1e-4) for x in prose]
    b, c = result(acc, prose), result(cand_acc, cand_prose, sha="b")
    c["provenance"]["batch_size"] = 4
    c["provenance"]["suite"]["settings"]["batch_size"] = 4
    v = decide(policy, b, c, None)
    assert v.verdict == "pass", render_text(v)


def test_planted_three_point_drop_is_rejected(policy):
    acc, prose = baseline()
    rng = random.Random(7)
    right = [i for i, s in enumerate(acc) if s == 1.0]
    cand = list(acc)
    for i in rng.sample(right, 60):  # 60 of 2000 = 3 points
        cand[i] = 0.0
    v = decide(policy, result(acc, prose), result(cand, prose, sha="b"), None)
    assert v.verdict == "rejected" and v.exit_code == 1
    ev = v.rules[0].evidence
    assert v.rules[0].verdict == "regression" and ev["delta"] == pytest.approx(-0.03)
    assert ev["flips_right_to_wrong"] == 60 and ev["flips_wrong_to_right"] == 0 and ev["mcnemar_p"] < 1e-10
    assert len(ev["examples_right_to_wrong"]) == 5
    assert v.rules[0].p_regression == pytest.approx(float(sps.norm.cdf(ev["delta"] / ev["se"])))
    assert v.rules[0].p_regression < policy.alpha  # the verdict's test: significantly below the baseline
    text = render_text(v)
    assert "REJECTED" in text and "McNemar" in text and "Holm-adjusted (m = 1)" in text and "margin −0.02" in text


def test_too_small_set_is_inconclusive_and_fails_closed(policy):
    acc, prose = baseline(n=40)
    rng = random.Random(3)
    cand = [1.0 - s if rng.random() < 0.1 else s for s in acc]
    v = decide(policy, result(acc, prose, clusters=40), result(cand, prose, clusters=40, sha="b"), None)
    assert v.rules[0].verdict == "inconclusive" and v.verdict == "inconclusive" and v.exit_code == 1
    assert v.rules[0].evidence["items_needed"] > 40
    text = render_text(v)
    assert "fails closed" in text and ("a pass needs about" in text or "past the margin" in text)


def test_inconclusive_can_be_allowed(policy):
    policy.fail_on_inconclusive = False
    acc, prose = baseline(n=40)
    cand = [1.0 - s if i % 10 == 0 else s for i, s in enumerate(acc)]
    v = decide(policy, result(acc, prose, clusters=40), result(cand, prose, clusters=40, sha="b"), None)
    assert v.verdict == "inconclusive" and v.exit_code == 0


def test_perplexity_rule_rejects_a_worse_model(policy):
    acc, prose = baseline()
    worse = [x * 1.2 for x in prose]  # 20% more NLL on every document
    v = decide(policy, result(acc, prose), result(acc, worse, sha="b"), None)
    assert v.rules[1].verdict == "regression" and v.rules[1].evidence["lower_bound"] > 1.05


@pytest.mark.parametrize("field,value", [("lm_eval_version", "0.4.99"), ("task_versions", {"t_acc": 2.0, "t_prose": 1.0}),
                                         ("golden.manifest_sha256", "n" * 64)])
def test_differing_provenance_is_refused(policy, field, value):
    acc, prose = baseline(n=100)
    b, c = result(acc, prose), result(acc, prose, sha="b")
    target = c["provenance"]
    *path, last = field.split(".")
    for part in path:
        target = target[part]
    target[last] = value
    with pytest.raises(UsageError, match=field.split(".")[-1]):
        decide(policy, b, c, None)


def test_suite_setting_difference_is_refused(policy):
    acc, prose = baseline(n=100)
    b, c = result(acc, prose), result(acc, prose, sha="b")
    c["provenance"]["suite"]["settings"]["subset"] = "smoke"
    with pytest.raises(UsageError, match="suite.settings.subset"):
        decide(policy, b, c, None)


def test_agreement_rules_are_tolerances(tmp_path):
    p = tmp_path / "gates" / "a.yaml"
    p.parent.mkdir()
    p.write_text("suite: evaluate/core.yaml\nrules:\n  - {agreement: kl, max: 0.05}\n  - {agreement: top1, min: 0.9}\n")
    pol = load_policy(p)
    acc, prose = baseline(n=100)
    harmless = {"kl_mean": 0.005, "kl_se": 0.001, "kl_p99": 0.05, "top1": 0.97, "top1_se": 0.005, "sum_min": 0.96,
                "sum_min_se": 0.004, "positions": 5000, "items": 200, "clusters": 150, "note": "lower bound"}
    v = decide(pol, result(acc, prose), result(acc, prose, sha="b"), harmless)
    assert v.verdict == "pass"
    harmful = dict(harmless, kl_mean=0.2, kl_se=0.01, top1=0.7)
    v = decide(pol, result(acc, prose), result(acc, prose, sha="b"), harmful)
    assert [r.verdict for r in v.rules] == ["regression", "regression"] and v.exit_code == 1
    assert all(r.p_regression < 1e-6 and r.p_holm < 1e-6 for r in v.rules)


def test_junit_has_one_case_per_rule(policy):
    acc, prose = baseline()
    cand = [0.0 if i < 200 else s for i, s in enumerate(acc)]
    v = decide(policy, result(acc, prose), result(cand, prose, sha="b"), None)
    root = ET.fromstring(render_junit(v))
    assert root.get("tests") == "2" and root.get("failures") == "1"
    cases = root.findall("testcase")
    assert cases[0].find("failure") is not None and cases[1].find("failure") is None


@pytest.mark.parametrize("text,msg", [
    ("suite: evaluate/core.yaml\nrules: []\n", "rules"),
    ("suite: evaluate/core.yaml\nrules:\n  - {task: t, metric: acc, margin: 0}\n", "margin"),
    ("suite: evaluate/core.yaml\nrules:\n  - {agreement: kl, min: 0.5}\n", "takes `max:`"),
    ("suite: evaluate/core.yaml\nrules:\n  - {task: t, metric: acc, margin: 0.02, maring: 1}\n", "unknown key"),
    ("rules:\n  - {task: t, metric: acc, margin: 0.02}\n", "suite"),
])
def test_bad_policy_exits_2(tmp_path, capsys, text, msg):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    assert main(["gate", str(p), "--baseline", str(tmp_path), "--candidate", str(tmp_path)]) == 2
    assert msg in capsys.readouterr().err


def test_gate_on_score_files(tmp_path, policy, capsys, monkeypatch):
    """End to end through the CLI with saved score files: exit code, JSON and JUnit written."""
    acc, prose = baseline()
    cand = [0.0 if i < 200 else s for i, s in enumerate(acc)]
    (tmp_path / "b.json").write_text(json.dumps(result(acc, prose)))
    (tmp_path / "c.json").write_text(json.dumps(result(cand, prose, sha="b")))
    pol = tmp_path / "gates" / "p.yaml"
    pol.parent.mkdir(exist_ok=True)
    pol.write_text("suite: evaluate/core.yaml\nrules:\n  - {task: t_acc, metric: acc, margin: 0.02}\n")
    junit = tmp_path / "gate.xml"
    code = main(["gate", str(pol), "--baseline", str(tmp_path / "b.json"), "--candidate", str(tmp_path / "c.json"),
                 "--json", "--junit", str(junit)])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["verdict"] == "rejected" and junit.is_file()
