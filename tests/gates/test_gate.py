"""The gate's decisions on synthetic per-item results: A/A passes, a planted 3-point drop is rejected with
its evidence, a too-small set is inconclusive (and fails closed), differing provenance is refused."""

from __future__ import annotations

import copy
import json
import random
import re
import xml.etree.ElementTree as ET

import pytest
import scipy.stats as sps

from quantize import stats
from quantize.cli import main
from quantize.errors import UsageError
from quantize.gates.policy import load_policy
from quantize.gates.render import render_junit, render_markdown, render_text
from quantize.records import Verdict, parse

from conftest import PROV, ROOT, baseline, judge, result


@pytest.fixture
def policy(tmp_path):
    p = tmp_path / "gates" / "p.yaml"
    p.parent.mkdir()
    p.write_text(
        "suite: evaluate/core.yaml\nalpha: 0.05\npower: 0.8\nrules:\n"
        "  - {task: t_acc, metric: acc, margin: 0.02}\n"
        "  - {task: t_prose, metric: perplexity, max_ratio: 1.05}\n"
    )
    return load_policy(p)


def test_a_a_passes(policy):
    acc, prose = baseline()
    v = judge(policy, result(acc, prose), result(acc, prose, sha="b"), None)
    assert v.verdict == "pass" and v.exit_code == 0
    assert v.rules[0].evidence.delta == 0 and v.rules[0].evidence.mcnemar_p == 1.0


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
    v = judge(policy, b, c, None)
    assert v.verdict == "pass", render_text(v)


def test_planted_three_point_drop_is_rejected(policy):
    acc, prose = baseline()
    rng = random.Random(7)
    right = [i for i, s in enumerate(acc) if s == 1.0]
    cand = list(acc)
    for i in rng.sample(right, 60):  # 60 of 2000 = 3 points
        cand[i] = 0.0
    v = judge(policy, result(acc, prose), result(cand, prose, sha="b"), None)
    assert v.verdict == "rejected" and v.exit_code == 1
    ev = v.rules[0].evidence
    assert v.rules[0].verdict == "regression" and ev.delta == pytest.approx(-0.03)
    assert ev.flips_right_to_wrong == 60 and ev.flips_wrong_to_right == 0 and ev.mcnemar_p < 1e-10
    assert len(ev.examples_right_to_wrong) == 5
    assert v.rules[0].p_regression == pytest.approx(float(sps.norm.cdf(ev.delta / ev.se)))
    assert v.rules[0].p_regression < policy.alpha  # the verdict's test: significantly below the baseline
    text = render_text(v)
    assert "REJECTED" in text and "McNemar" in text and "Holm-adjusted (m = 1)" in text and "margin −0.02" in text


def test_too_small_set_is_inconclusive_and_fails_closed(policy):
    acc, prose = baseline(n=40)
    rng = random.Random(3)
    cand = [1.0 - s if rng.random() < 0.1 else s for s in acc]
    v = judge(policy, result(acc, prose, clusters=40), result(cand, prose, clusters=40, sha="b"), None)
    assert v.rules[0].verdict == "inconclusive" and v.verdict == "inconclusive" and v.exit_code == 1
    assert v.rules[0].evidence.items_needed > 40
    text = render_text(v)
    assert "fails closed" in text and ("a pass needs about" in text or "past the margin" in text)


def test_inconclusive_can_be_allowed(policy):
    policy.fail_on_inconclusive = False
    acc, prose = baseline(n=40)
    cand = [1.0 - s if i % 10 == 0 else s for i, s in enumerate(acc)]
    v = judge(policy, result(acc, prose, clusters=40), result(cand, prose, clusters=40, sha="b"), None)
    assert v.verdict == "inconclusive" and v.exit_code == 0


def test_perplexity_rule_rejects_a_worse_model(policy):
    acc, prose = baseline()
    worse = [x * 1.2 for x in prose]  # 20% more NLL on every document
    v = judge(policy, result(acc, prose), result(acc, worse, sha="b"), None)
    assert v.rules[1].verdict == "regression" and v.rules[1].evidence.lower_bound > 1.05


@pytest.mark.parametrize(
    "field,value",
    [
        ("lm_eval_version", "0.4.99"),
        ("task_versions", {"t_acc": 2.0, "t_prose": 1.0}),
        ("golden.manifest_sha256", "n" * 64),
    ],
)
def test_differing_provenance_is_refused(policy, field, value):
    acc, prose = baseline(n=100)
    b, c = result(acc, prose), result(acc, prose, sha="b")
    target = c["provenance"]
    *path, last = field.split(".")
    for part in path:
        target = target[part]
    target[last] = value
    with pytest.raises(UsageError, match=field.split(".")[-1]):
        judge(policy, b, c, None)


def test_suite_setting_difference_is_refused(policy):
    acc, prose = baseline(n=100)
    b, c = result(acc, prose), result(acc, prose, sha="b")
    c["provenance"]["suite"]["settings"]["subset"] = "smoke"
    with pytest.raises(UsageError, match="suite.settings.subset"):
        judge(policy, b, c, None)


def agreement(**given) -> dict:
    """An agreement result's fields, every position agreeing unless `given` says otherwise."""
    same = {"kl_mean": 0.0, "kl_se": 0.0, "kl_p99": 0.0, "top1": 1.0, "top1_se": 0.0, "sum_min": 1.0}
    return same | {"sum_min_se": 0.0, "positions": 600, "items": 60, "clusters": 60, "note": "lower bound"} | given


def test_agreement_rules_are_tolerances(tmp_path):
    p = tmp_path / "gates" / "a.yaml"
    p.parent.mkdir()
    p.write_text("suite: evaluate/core.yaml\nrules:\n  - {agreement: kl, max: 0.05}\n  - {agreement: top1, min: 0.9}\n")
    pol = load_policy(p)
    acc, prose = baseline(n=100)
    harmless = {
        "kl_mean": 0.005,
        "kl_se": 0.001,
        "kl_p99": 0.05,
        "top1": 0.97,
        "top1_se": 0.005,
        "sum_min": 0.96,
        "sum_min_se": 0.004,
        "positions": 5000,
        "items": 200,
        "clusters": 150,
        "note": "lower bound",
    }
    v = judge(pol, result(acc, prose), result(acc, prose, sha="b"), harmless)
    assert v.verdict == "pass"
    harmful = dict(harmless, kl_mean=0.2, kl_se=0.01, top1=0.7)
    v = judge(pol, result(acc, prose), result(acc, prose, sha="b"), harmful)
    assert [r.verdict for r in v.rules] == ["regression", "regression"] and v.exit_code == 1
    assert all(r.p_regression < 1e-6 and r.p_holm < 1e-6 for r in v.rules)


@pytest.mark.parametrize("positions,verdict", [(20, "inconclusive"), (2000, "pass")])
def test_positions_that_all_agree_are_not_certainty(tmp_path, positions, verdict):
    # every position agrees: the clustered SE is 0, which made a bound of exactly 1 and a pass on any count
    p = tmp_path / "gates" / "a.yaml"
    p.parent.mkdir()
    p.write_text("suite: evaluate/core.yaml\nrules:\n  - {agreement: top1, min: 0.9}\n")
    acc, prose = baseline(n=100)
    v = judge(load_policy(p), result(acc, prose), result(acc, prose, sha="b"), agreement(top1=1.0, positions=positions))
    e = v.rules[0].evidence
    assert v.rules[0].verdict == verdict and e.se_clustered == 0
    assert e.lower_bound == pytest.approx(positions / (positions + stats.z(0.95) ** 2))  # Wilson's at p = 1
    assert e.upper_bound == 1 and "Wilson's over the positions" in render_text(v)


@pytest.mark.parametrize("metric,limit", [("top1", "min: 0.3"), ("sum_min", "min: 0.3"), ("kl", "max: 1e9")])
def test_non_finite_logits_anywhere_fail_every_agreement_rule(tmp_path, metric, limit):
    """A review: NaN rows count as disagreements in top-1 (finite: 0.43 over 627 positions passed min 0.3), while
    KL and Σ min(p, q) were NaN in the same agreement result."""
    p = tmp_path / "gates" / "a.yaml"
    p.parent.mkdir()
    p.write_text(f"suite: evaluate/core.yaml\nrules:\n  - {{agreement: {metric}, {limit}}}\n")
    acc, prose = baseline(n=100)
    nan = agreement(top1=0.43, kl_mean=float("nan"), sum_min=float("nan"))
    v = judge(load_policy(p), result(acc, prose), result(acc, prose, sha="b"), nan)
    assert v.rules[0].verdict == "regression" and v.exit_code == 1
    assert "not finite somewhere (KL nan" in v.rules[0].non_finite


def test_a_sequential_looks_perplexity_weighs_each_stratum_as_the_golden_set_does(tmp_path):
    """A review: every item at risk drawn (no change) and a third of the stable ones (0.1 nat worse each) gave the
    sample's ratio exp(0.1 · 100 / 200), a pass under 1.06 where scoring every item gives exp(0.075), a regression."""
    import math

    from quantize.gates.gate import Look, perplexity_rule
    from quantize.records import ScoreDoc

    p = tmp_path / "gates" / "a.yaml"
    p.parent.mkdir()
    p.write_text("suite: evaluate/core.yaml\nrules:\n  - {task: t_acc, metric: perplexity, max_ratio: 1.06}\n")
    acc, prose = baseline(n=400)
    base, cand = result(acc, prose), result(acc, prose, sha="b")
    items = cand["tasks"]["t_acc"]["items"]
    strata = {i["id"]: "at_risk" if n < 100 else "stable" for n, i in enumerate(items)}
    for n, i in enumerate(items):
        i["ll"] -= 0.1 if n >= 100 else 0.0
    cand["tasks"]["t_acc"]["items"] = [i for n, i in enumerate(items) if n < 100 or n % 3 == 0]
    look = Look(1, 1.645, {"t_acc": strata}, {"t_acc": {"at_risk": 100, "stable": 300}})
    rule = load_policy(p).rules[0]
    b, c = parse(ScoreDoc, base, "baseline"), parse(ScoreDoc, cand, "candidate")
    r = perplexity_rule(rule, "ppl", b, c, 0.05, seed=0, look=look)
    drawn = sum(1 for n in range(100, 400) if n % 3 == 0)  # the stable items drawn: each stands for 300 / drawn
    assert r.evidence.ratio == pytest.approx(math.exp(0.1 * 300 / 400)) and drawn == 100
    assert r.verdict == "regression"


def test_a_document_of_another_length_on_one_side_is_exit_2(policy):
    """A review: the candidate's words (5 or 1e9) were ignored and the baseline's used."""
    acc, prose = baseline(n=100)
    cand = result(acc, prose, sha="b")
    cand["tasks"]["t_prose"]["items"][4]["words"] = 5
    with pytest.raises(UsageError, match="t_prose: 1 document.s. count other words on the two sides .e.g. p0004"):
        judge(policy, result(acc, prose), cand)


def test_a_prompt_hash_on_one_side_only_is_exit_2():
    acc, prose = baseline(n=100)
    base, cand = result(acc, prose), result(acc, prose, sha="b")
    for d in (base, cand):
        for i in d["tasks"]["t_acc"]["items"]:
            i["prompt_sha256"] = "h" * 64
    cand["tasks"]["t_acc"]["items"][3]["prompt_sha256"] = None  # an edited file: the check skipped the item
    p = ROOT / "gates" / "ci.yaml"
    pol = load_policy(p).model_copy(update={"rules": [load_policy(p).rules[0].model_copy(update={"task": "t_acc"})]})
    with pytest.raises(UsageError, match="prompt hash on one side only"):
        judge(pol, base, cand)


def test_nan_on_a_task_no_rule_judges_is_named_in_the_notes(policy):
    acc, prose = baseline(n=100)
    cand = result(acc, prose, sha="b")
    cand["tasks"]["t_prose"]["items"][2].update(ll=float("nan"), score=float("nan"))
    one_task = policy.model_copy(update={"rules": [r for r in policy.rules if r.task == "t_acc"]})
    v = judge(one_task, result(acc, prose), cand)
    assert [n for n in v.notes if "NaN or infinity on 1 item(s) of t_prose" in n and "no rule" in n]
    assert not [n for n in judge(policy, result(acc, prose), cand).notes if "no rule" in n]  # judged: its rule's


def test_junit_has_one_case_per_rule(policy):
    acc, prose = baseline()
    cand = [0.0 if i < 200 else s for i, s in enumerate(acc)]
    v = judge(policy, result(acc, prose), result(cand, prose, sha="b"), None)
    root = ET.fromstring(render_junit(v))
    assert root.get("tests") == "2" and root.get("failures") == "1"
    cases = root.findall("testcase")
    assert cases[0].find("failure") is not None and cases[1].find("failure") is None


@pytest.mark.parametrize(
    "text,msg",
    [
        ("suite: evaluate/core.yaml\nrules: []\n", "rules"),
        ("suite: evaluate/core.yaml\nrules:\n  - {task: t, metric: acc, margin: 0}\n", "margin"),
        ("suite: evaluate/core.yaml\nrules:\n  - {agreement: kl, min: 0.5}\n", "takes `max:`"),
        ("suite: evaluate/core.yaml\nrules:\n  - {task: t, metric: acc, margin: 0.02, maring: 1}\n", "unknown key"),
        ("rules:\n  - {task: t, metric: acc, margin: 0.02}\n", "suite"),
        # an infinite limit was taken, and the gate then blamed the candidate's "evidence not finite" (a review)
        ("suite: evaluate/core.yaml\nrules:\n  - {task: t, metric: perplexity, max_ratio: .inf}\n", "max_ratio"),
        ("suite: evaluate/core.yaml\nrules:\n  - {agreement: kl, max: .inf}\n", "max"),
        (
            "suite: evaluate/core.yaml\nrules:\n  - {task: t, metric: acc, margin: 0.02}\n"
            "  - {task: t, metric: acc, margin: 0.05}\n",
            "rules 1 and 2 both judge t acc",
        ),
        (
            "suite: evaluate/core.yaml\nrules:\n  - {agreement: kl, max: 0.2}\n  - {agreement: kl, max: 0.5}\n",
            "both judge agreement kl",
        ),
        # boundaries that cannot be computed: exit 3 after the baseline was scored, before
        (
            f"suite: {ROOT / 'evaluate' / 'core.yaml'}\nsequential: {{looks: [0.01, 0.02, 1.0]}}\nrules:\n"
            "  - {task: core_facts, metric: acc, margin: 0.02}\n",
            "sequential.looks [0.01, 0.02, 1.0]: look 2 at 0.02 spends",
        ),
    ],
)
def test_bad_policy_exits_2(tmp_path, capsys, text, msg):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    assert main(["gate", str(p), "--baseline", str(tmp_path), "--candidate", str(tmp_path)]) == 2
    assert msg in capsys.readouterr().err


def score_file_setup(tmp_path, batch_size: int = 16):
    """A suite on the shipped golden set with two of its tasks, a policy on it, and the provenance its scores carry."""
    from quantize.evaluate.suite import open_suite

    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"golden: {ROOT / 'golden' / 'core' / 'v1'}\ntasks: [core_facts, core_prose]\nbatch_size: {batch_size}\n"
    )
    s = open_suite(suite)
    prov = copy.deepcopy(PROV) | {
        "suite": {"path": str(suite), "name": "suite", "sha256": s.sha256, "settings": s.suite.settings()},
        "golden": s.golden.provenance(),
        "task_versions": {"core_facts": 1.0, "core_prose": 1.0},
    }
    pol = tmp_path / "gates" / "p.yaml"
    pol.parent.mkdir(exist_ok=True)
    pol.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.02}}\n")
    return pol, prov


def on_golden(doc: dict, suite_file) -> dict:
    """`doc` (conftest.result) with each task's items renamed to the golden items the suite scores, in their
    clusters, as many as the golden set holds (the scores cycled), and the figures those items give."""
    from quantize.evaluate.samples import suite_items
    from quantize.evaluate.suite import open_suite
    from quantize.golden.manifest import item_id
    from quantize.kinds import KINDS

    s = open_suite(suite_file)
    for task, t in doc["tasks"].items():
        key = s.golden.item_key(task)
        golden = [item_id(d, key) for d in suite_items(s, task).values()]
        t["items"] = [dict(t["items"][n % len(t["items"])], id=i, cluster=c) for n, (i, c) in enumerate(golden)]
        if (kind := s.golden.entry(task).output_type) == "multiple_choice" != t["output_type"]:
            t["output_type"] = kind  # right/wrong items of two choices, the gold one first
            for item in t["items"]:
                item["lls"] = [item["ll"], item["ll"] - 1.0]
        t["n"] = len(t["items"])
        t.update(KINDS[t["output_type"]].summary(t["items"], t.get("filter")))
    return doc


def test_gate_on_score_files(tmp_path, capsys):
    """End to end through the CLI with saved score files: exit code, JSON and JUnit written."""
    pol, prov = score_file_setup(tmp_path)
    acc, prose = baseline()
    cand = [0.0 if i < 200 else s for i, s in enumerate(acc)]
    tasks = ("core_facts", "core_prose")
    suite = tmp_path / "suite.yaml"
    (tmp_path / "b.json").write_text(json.dumps(on_golden(result(acc, prose, tasks=tasks, prov=prov), suite)))
    (tmp_path / "c.json").write_text(json.dumps(on_golden(result(cand, prose, sha="b", tasks=tasks, prov=prov), suite)))
    junit = tmp_path / "gate.xml"
    code = main(
        [
            "gate",
            str(pol),
            "--baseline",
            str(tmp_path / "b.json"),
            "--candidate",
            str(tmp_path / "c.json"),
            "--json",
            "--junit",
            str(junit),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["verdict"] == "rejected" and junit.is_file()
    assert parse(Verdict, out, "stdout").rules[0].evidence.flips_right_to_wrong > 0


def test_the_verdict_names_the_policys_suite_not_the_file_that_scored_the_baseline(tmp_path, capsys):
    """Scores keyed by equal settings are shared by every suite file that holds them: a baseline first scored under
    another file (its provenance names that file) gave a verdict, and a model card, naming that file as the suite
    (a review). The verdict names the suite its policy names; the scores keep their own provenance."""
    pol, prov = score_file_setup(tmp_path)
    first = tmp_path / "first" / "suite.yaml"
    first.parent.mkdir()
    first.write_text((tmp_path / "suite.yaml").read_text())  # the same settings in another file
    prov["suite"]["path"] = str(first)
    acc, prose = baseline()
    tasks = ("core_facts", "core_prose")
    suite = tmp_path / "suite.yaml"
    (tmp_path / "b.json").write_text(json.dumps(on_golden(result(acc, prose, tasks=tasks, prov=prov), suite)))
    (tmp_path / "c.json").write_text(json.dumps(on_golden(result(acc, prose, sha="b", tasks=tasks, prov=prov), suite)))
    argv = ["gate", str(pol), "--baseline", str(tmp_path / "b.json"), "--candidate", str(tmp_path / "c.json")]
    assert main([*argv, "--json"]) == 0
    v = parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
    assert v.provenance.suite == load_policy(pol).suite == str(suite)


def test_score_files_of_another_suite_are_refused(tmp_path, capsys):
    """Scores from a suite with other settings (here: a smoke subset) cannot be judged by this policy."""
    pol, prov = score_file_setup(tmp_path)
    acc, prose = baseline()
    other = copy.deepcopy(prov)
    other["suite"]["settings"]["subset"] = "smoke"
    tasks = ("core_facts", "core_prose")
    (tmp_path / "b.json").write_text(json.dumps(result(acc, prose, tasks=tasks, prov=other)))
    (tmp_path / "c.json").write_text(json.dumps(result(acc, prose, sha="b", tasks=tasks, prov=other)))
    assert (
        main(["gate", str(pol), "--baseline", str(tmp_path / "b.json"), "--candidate", str(tmp_path / "c.json")]) == 2
    )
    err = capsys.readouterr().err
    assert "another suite" in err and "subset" in err and "Traceback" not in err


def _items(doc: dict, task: str) -> list[dict]:
    return doc["tasks"][task]["items"]


def _item(doc: dict, task: str) -> dict:
    return _items(doc, task)[0]


@pytest.mark.parametrize(
    "edit,msg",
    [
        (lambda d: d.pop("schema_version"), "no schema_version"),
        (lambda d: d.update(schema_version=7), "schema_version 7"),
        (lambda d: d.update(surprise=1), "unknown key `surprise`"),
        (lambda d: d["provenance"].pop("golden"), "`provenance.golden` is required"),
        (lambda d: d["tasks"]["core_facts"]["items"][0].pop("id"), "id"),
        # a review's edits, each accepted before (exit 0): a figure no model computes
        (lambda d: _item(d, "core_prose").update(ll=50.0, score=50.0), "at most 0; got 50.0"),
        (lambda d: _item(d, "core_facts").update(score=0.5), "scores 0 or 1; got 0.5"),
        (lambda d: _item(d, "core_prose").update(words=0), "greater than or equal to 1"),
        # items other than the golden set's, figures their items do not give, another kind or version
        (lambda d: _items(d, "core_facts").append(dict(_item(d, "core_facts"), score=1.0)), "item(s) twice"),
        (lambda d: _items(d, "core_facts").append(dict(_item(d, "core_facts"), id="f-99999")), "not in the golden"),
        (lambda d: _items(d, "core_facts").pop(), "item(s) missing"),
        (lambda d: _item(d, "core_facts").update(cluster="mine"), "another cluster than the golden set's"),
        (lambda d: d["tasks"]["core_facts"].update(acc=0.99), "acc is 0.99 but its items give"),
        (lambda d: d["tasks"]["core_facts"].update(version=2.0), "core_facts is version 2.0, its provenance says 1.0"),
    ],
)
def test_hand_edited_score_file_is_refused_with_exit_2(tmp_path, capsys, edit, msg):
    pol, prov = score_file_setup(tmp_path)
    acc, prose = baseline(n=50)
    tasks = ("core_facts", "core_prose")
    good = on_golden(result(acc, prose, tasks=tasks, prov=prov), tmp_path / "suite.yaml")
    bad = copy.deepcopy(good)
    edit(bad)
    (tmp_path / "b.json").write_text(json.dumps(good))
    (tmp_path / "c.json").write_text(json.dumps(bad))
    assert (
        main(["gate", str(pol), "--baseline", str(tmp_path / "b.json"), "--candidate", str(tmp_path / "c.json")]) == 2
    )
    err = capsys.readouterr().err
    assert msg in err and "quantize eval" in err and "Traceback" not in err


def test_a_rule_with_a_custom_name_keeps_its_evidence(tmp_path):
    """The report finds a rule's evidence by task, not by its label."""
    p = tmp_path / "gates" / "n.yaml"
    p.parent.mkdir()
    p.write_text("suite: evaluate/core.yaml\nrules:\n  - {name: knowledge, task: t_acc, metric: acc, margin: 0.02}\n")
    acc, prose = baseline(n=200)
    v = judge(load_policy(p), result(acc, prose), result(acc, prose, sha="b"))
    assert v.rules[0].rule == "knowledge" and v.accuracy_evidence("t_acc") is v.rules[0].evidence
    assert v.accuracy_evidence("t_prose") is None


def test_names_forge_no_headline_row_or_tag_in_markdown_junit_or_text(tmp_path):
    """A policy and rules named to forge a PASS headline above a REJECTED table, a tag, a table row, and to break the
    XML (a NUL byte, an escape): every output shows the names as text, on one line, and JUnit stays well-formed."""
    p = tmp_path / "gates" / "evil.yaml"
    p.parent.mkdir()
    p.write_text(
        'name: "ok`\\n### quantize gate: ✅ PASS\\n<script>alert(1)</script>"\nsuite: evaluate/core.yaml\nrules:\n'
        '  - {name: "drop | pass | - | - | - | - | ok |\\n# PASS", task: t_acc, metric: acc, margin: 0.02}\n'
        '  - {name: "nul\\0 esc\\e <b>bold</b>", task: t_prose, metric: perplexity, max_ratio: 1.05}\n'
    )
    acc, prose = baseline()
    cand = [0.0 if i < 200 else s for i, s in enumerate(acc)]
    v = judge(load_policy(p), result(acc, prose), result(cand, prose, sha="b"))
    assert v.verdict == "rejected"
    md = render_markdown(v)
    lines = md.splitlines()
    assert [line for line in lines if line.lstrip().startswith("#")] == [lines[0]]
    assert lines[0].startswith("### quantize gate ``") and lines[0].endswith("❌ REJECTED")
    rows = [line for line in lines if line.startswith("|")]
    assert len(rows) == 2 + 2 and all(len(re.findall(r"(?<!\\)\|", row)) == 8 for row in rows)
    markdown_it = pytest.importorskip("markdown_it")
    page = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert page.count("<h3>") == 1 and "<h1>" not in page and "<script>" not in page and "<b>" not in page
    assert page.count("<tr>") == 3 and page.count("<td>") == 2 * 7
    root = ET.fromstring(render_junit(v))  # a NUL or ESC written raw is not XML: this would raise
    names = [root.get("name"), *(c.get("name") for c in root.iter("testcase"))]
    names += [f.get("message") for f in root.iter("failure")]
    assert all(n and not re.search(r"[\x00-\x1f]", n) for n in names)
    assert root.find("testcase").get("name") == "drop | pass | - | - | - | - | ok |\\n# PASS"
    text = render_text(v)
    assert not any(line.startswith(("# PASS", "### quantize", "<script")) for line in text.splitlines())
    assert "\x1b" not in text and "\x00" not in text


def test_the_text_names_the_metric_a_rule_judged(policy):
    """An acc_norm or exact_match rule's line read "acc 0.2239 -> ...": it names the rule's metric now."""
    acc, prose = baseline()
    v = judge(policy, result(acc, prose), result(acc, prose, sha="b"), None)
    assert "\n    acc 0." in render_text(v) or "\n    acc 1." in render_text(v)
    renamed = v.model_copy(update={"rules": [v.rules[0].model_copy(update={"metric": "acc_norm"}), *v.rules[1:]]})
    text = render_text(renamed)
    assert "    acc_norm " in text and "\n    acc 0." not in text and "\n    acc 1." not in text


def test_one_cluster_is_no_regression_against_itself(policy):
    """Every item of a task in one cluster (a golden set frozen with a cluster field of one value): the clustered SE
    was infinite, "evidence not finite", and the baseline was REJECTED against itself (a review's repro)."""
    acc, prose = baseline()
    v = judge(policy, result(acc, prose, clusters=1), result(acc, prose, clusters=1, sha="b"), None)
    assert v.verdict == "pass", render_text(v)
    assert v.rules[0].evidence.clusters == 1 and v.rules[0].evidence.se_clustered == 0.0  # the paired SE of no change


def test_a_candidate_past_a_floats_perplexity_is_rejected_not_a_crash(policy):
    """Log-likelihoods thousands of nats worse per word (its logits exploded, still finite): math.exp overflowed
    into exit 3; the perplexity is infinite, non-finite evidence, a regression."""
    acc, prose = baseline()
    v = judge(policy, result(acc, prose), result(acc, [x * 1000 for x in prose], sha="b"), None)
    assert v.verdict == "rejected" and v.rules[1].verdict == "regression"
    assert "not finite" in (v.rules[1].non_finite or "")


def hashed(doc: dict, differ: tuple[int, ...] = (), missing: bool = False) -> dict:
    """`doc` (on the golden items) with every item's token hash as our engines record them, one text on both sides,
    but for the facts items at positions `differ` (scored on other tokens); `missing`: no hashes at all (a file
    written before they were recorded)."""
    for task, t in doc["tasks"].items():
        for n, i in enumerate(t["items"]):
            other = task == "core_facts" and n in differ
            i["tokens_sha256"] = None if missing else sha256_hex(f"{i['id']} {'other' if other else 'same'}")
    return doc


def sha256_hex(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def llamacpp_side(doc: dict) -> dict:
    """`doc` as a GGUF's scores in llama.cpp record their provenance."""
    doc["provenance"].update(backend="llamacpp", dtype="gguf", engine="llamacpp-2 llama-cpp-python 0.3.36 build x")
    return doc


def gate_files(tmp_path, capsys, base: dict, cand: dict, allow: bool = False) -> tuple[int, dict | None, str]:
    """`quantize gate --json` on two score files of score_file_setup's suite (facts and prose judged): exit code,
    the verdict (None on exit 2) and stderr."""
    pol, _ = score_file_setup(tmp_path)
    extra = "allow_different_tokenizer: true\n" if allow else ""
    pol.write_text(extra + pol.read_text() + "  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n")
    for name, doc in (("b.json", base), ("c.json", cand)):
        (tmp_path / name).write_text(json.dumps(doc))
    code = main(
        ["gate", str(pol), "--baseline", str(tmp_path / "b.json"), "--candidate", str(tmp_path / "c.json"), "--json"]
    )
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, (json.loads(out) if code != 2 else None), err


def token_sides(tmp_path, differ=(), base_missing=False, cand_missing=False) -> tuple[dict, dict]:
    """A baseline and a candidate score file on score_file_setup's golden items, the same numbers, hashed."""
    _, prov = score_file_setup(tmp_path)
    acc, prose = baseline()
    tasks = ("core_facts", "core_prose")
    suite = tmp_path / "suite.yaml"
    base = hashed(on_golden(result(acc, prose, tasks=tasks, prov=prov), suite), missing=base_missing)
    cand = on_golden(result(acc, prose, sha="b", tasks=tasks, prov=prov), suite)
    return base, hashed(cand, differ, missing=cand_missing)


def test_score_files_scored_on_other_tokens_are_exit_2_naming_the_items(tmp_path, capsys):
    """The issue's repro: a baseline's score file and a candidate whose tokenizer splits " the" otherwise (one merge
    removed from tokenizer.json, the vocabulary unchanged) were paired, and the verdict measured the tokenizers
    (prose perplexity ratio 1.79 on the default model's own weights). Each item records the hash of the tokens its
    engine scored: a side without a checkpoint is compared by them."""
    base, cand = token_sides(tmp_path, differ=(0, 5))
    code, _, err = gate_files(tmp_path, capsys, base, cand)
    ids = [i["id"] for i in cand["tasks"]["core_facts"]["items"]]
    assert code == 2 and "scored on other tokens for 2 item(s)" in err
    assert f"core_facts: {', '.join(sorted([ids[0], ids[5]]))}" in err and "allow_different_tokenizer" in err
    code, v, _ = gate_files(tmp_path, capsys, base, cand, allow=True)  # the policy's consent, said in the verdict
    assert code in (0, 1) and any("other tokens for 2 of" in n and "allowed by the policy" in n for n in v["notes"])
    base, cand = token_sides(tmp_path)
    code, v, _ = gate_files(tmp_path, capsys, base, cand)
    n = len(base["tasks"]["core_facts"]["items"]) + len(base["tasks"]["core_prose"]["items"])
    assert code == 0 and f"both sides scored the same tokens on all {n} items" in " ".join(v["notes"])


def test_a_score_file_without_token_hashes_falls_back_and_says_so(tmp_path, capsys):
    """A file written before hashes were recorded pairs as before, with a note saying the tokens were not compared;
    a side scored in llama.cpp still pairs only where its tokens were compared."""
    base, cand = token_sides(tmp_path, base_missing=True)
    code, v, _ = gate_files(tmp_path, capsys, base, cand)
    assert code == 0 and any("the baseline side records no token hashes" in n for n in v["notes"])
    code, _, err = gate_files(tmp_path, capsys, llamacpp_side(base), cand)
    assert code == 2 and "a side records no token hashes" in err


def test_a_side_that_hashes_only_some_items_is_exit_2_naming_the_others(tmp_path, capsys):
    """A review: one baseline item's hash set to null turned the token comparison off for every item, and the note
    said the baseline side recorded no token hashes (it recorded 39 of 40): a candidate whose pre-tokenizer differed
    passed. Our engines record a hash for every item or for none: a side with some is refused, naming the items
    without one (the ones that would escape the comparison), whatever the policy allows."""
    base, cand = token_sides(tmp_path, differ=(1,))
    facts = base["tasks"]["core_facts"]["items"]
    facts[4]["tokens_sha256"] = None
    for allow in (False, True):
        code, _, err = gate_files(tmp_path, capsys, base, cand, allow=allow)
        assert code == 2 and "the baseline's scores" in err and "not for 1 item(s)" in err
        assert f"core_facts: {facts[4]['id']}" in err and "--json --items" in err
    base, cand = token_sides(tmp_path)
    prose = cand["tasks"]["core_prose"]["items"]
    for i in (0, 2):
        prose[i]["tokens_sha256"] = None
    code, _, err = gate_files(tmp_path, capsys, base, cand)
    assert code == 2 and "the candidate's scores" in err and "not for 2 item(s)" in err
    assert f"core_prose: {', '.join(sorted([prose[0]['id'], prose[2]['id']]))}" in err
    for t in cand["tasks"].values():  # none recorded on that side: paired as a file from before hashes, and said
        for i in t["items"]:
            i["tokens_sha256"] = None
    code, v, _ = gate_files(tmp_path, capsys, base, cand)
    assert code == 0 and any("the candidate side records no token hashes" in n for n in v["notes"])


def test_a_score_file_scored_in_llama_cpp_pairs_where_its_token_hashes_agree(tmp_path, capsys):
    """A GGUF's score file was refused beside any other side but itself (its tokens could not be compared); its
    items' token hashes compare them now, and then its engine fields may differ, as after the checkpoints' check.
    One item scored on other tokens is exit 2 whatever the policy allows."""
    base, cand = token_sides(tmp_path)
    code, v, _ = gate_files(tmp_path, capsys, llamacpp_side(base), cand)
    assert code == 0 and any("same tokens on all" in n for n in v["notes"])
    base, cand = token_sides(tmp_path, differ=(3,))
    code, _, err = gate_files(tmp_path, capsys, llamacpp_side(base), cand, allow=True)
    assert code == 2 and "scored on other tokens for 1 item(s)" in err and "allow_different_tokenizer" not in err
