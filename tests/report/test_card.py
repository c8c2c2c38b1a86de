"""A verdict in the candidate's model card: model-index results that huggingface_hub reads back, a human section,
both replaced (not stacked) by a later verdict, the card's own text and other results kept, and a verdict of
another checkpoint refused."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import xml.etree.ElementTree as ET

import pytest
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from quantize.cli import main
from quantize.flows import gate as flows_gate
from quantize.records import Verdict, parse

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
    assert [(r.task_name, r.metric_type) for r in ours] == [
        ("core_facts", "acc"),
        ("core_prose", "perplexity"),
        ("agreement", "kl"),
    ]
    facts = next(r for r in verdict["rules"] if r["rule"] == "core_facts acc")["evidence"]
    assert ours[0].metric_value == facts["candidate"] and ours[0].metric_args["baseline"] == facts["baseline"]
    assert (
        ours[0].dataset_name == "core/v1 core_facts"
        and ours[0].dataset_revision == verdict["provenance"]["golden"]["manifest_sha256"]
    )
    assert "Mine." in card.text and "## Quality gate: pass" in card.text and "| `agreement kl` | pass |" in card.text
    # a later verdict replaces the earlier one
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 0
    again = ModelCard.load(cand / "README.md")
    assert len(again.data.eval_results) == 4 and again.text.count("## Quality gate") == 1


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
    verdict["verdict"], verdict["exit_code"] = "rejected", 1  # what its rules give (a pass above them is refused)
    (tmp_path / "v.json").write_text(json.dumps(verdict))
    assert main(["card", str(cand), "--verdict", str(_gates_own(tmp_path / "v.json"))]) == 0
    text = (cand / "README.md").read_text()
    card = ModelCard.load(cand / "README.md")
    assert [r.task_name for r in card.data.eval_results] == ["core_prose", "agreement"]
    assert "nan" not in text.split("---")[1].lower()
    assert "| `core_facts acc` | regression (candidate accuracy) |" in text


@pytest.mark.parametrize(
    "rule,bound,past",
    [
        ("core_facts acc", "lower_bound", lambda ev: -ev["margin"] - 0.4),  # a review's forge1.json: -0.9 vs -0.5
        ("core_prose perplexity", "upper_bound", lambda ev: ev["max_ratio"] + 1.0),
        ("agreement kl", "upper_bound", lambda ev: ev["max"] + 1.0),
    ],
)
def test_a_rule_passed_above_bounds_that_break_its_limit_is_not_published(
    verdict, tiny_model, tmp_path, capsys, rule, bound, past
):
    """A verdict file named to `card --verdict` whose rule says pass while its own bound is past the rule's limit
    was published into model-index. Each rule's outcome must be what its evidence gives by the gate's decision: exit
    2 naming the rule and the outcome its bounds give, and no card written."""
    forged = json.loads(json.dumps(verdict))
    r = next(r for r in forged["rules"] if r["rule"] == rule)
    assert r["verdict"] == "pass"
    ev = r["evidence"]
    ev[bound] = past(ev)
    (tmp_path / "v.json").write_text(json.dumps(forged))
    cand = _candidate(tiny_model, tmp_path)
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 2
    assert not (cand / "README.md").exists()
    from quantize.records import limit_outcome, noninferiority_outcome

    gives = (
        noninferiority_outcome(ev["delta"], ev["lower_bound"], ev["upper_bound"], ev["margin"])
        if "margin" in ev
        else limit_outcome(ev["lower_bound"], ev["upper_bound"], at_most=ev.get("max_ratio", ev.get("max")))
    )
    assert gives != "pass"  # what the gate decides from these bounds, named in the refusal
    assert f"rule {rule} is pass, and its own evidence gives {gives}" in capsys.readouterr().err


# --- what the card writer reads, when it checks it, and what it writes (issue #41) --------------------------------

SECRET = "HF_TOKEN=hf_not_a_real_token_but_a_canary"


@pytest.fixture(scope="module")
def verdict(policy, tiny_model, tmp_path_factory):
    """A real verdict of a copy of the tiny model, as `gate --json` prints it (tests edit copies of it)."""
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()) as out:
        mp.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-card"))
        cand = tmp_path_factory.mktemp("verdict") / "cand"
        shutil.copytree(tiny_model, cand)
        assert main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand), "--json"]) == 0
    return json.loads(out.getvalue())


def _candidate(tiny_model, tmp_path):
    """A copy of the tiny model: the same identity as the verdict's candidate."""
    cand = tmp_path / "cand"
    shutil.copytree(tiny_model, cand)
    return cand


def _gates_own(path):
    """Keep the verdict at `path` in the cache as a gate run with it would (evaluate/cache.py store_verdict): a
    verdict edited here to shape the card stands for one a gate decided; `card` publishes no other."""
    from quantize import records
    from quantize.evaluate import cache

    cache.store_verdict(records.read(Verdict, path))
    return path


def _no_scoring(monkeypatch):
    """Any gate run from here on fails the test: a refusal must come before anything is scored."""

    def refuse(*_a, **_k):
        raise AssertionError("the gate ran (scoring) before the card was checked")

    monkeypatch.setattr(flows_gate, "run_gate", refuse)


def test_a_readme_linked_elsewhere_is_refused_and_never_read(
    policy, verdict, tiny_model, tmp_path, capsys, monkeypatch
):
    """README.md linked to a file of secrets (as to /proc/self/environ): exit 2 naming it and saying to put a file
    there, before any scoring under `gate --card`, and from `card --verdict`; the secret is in no output and the
    link and its target are left as they were."""
    cand = _candidate(tiny_model, tmp_path)
    env = tmp_path / "environ"
    env.write_text(f"PATH=/usr/bin\n{SECRET}\n")
    (cand / "README.md").symlink_to(env)
    (tmp_path / "v.json").write_text(json.dumps(verdict))
    _no_scoring(monkeypatch)
    runs = [
        ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand), "--card", "--json"],
        ["card", str(cand), "--verdict", str(tmp_path / "v.json")],
    ]
    for args in runs:
        assert main(args) == 2
        out = capsys.readouterr()
        assert "README.md" in out.err and "symbolic link" in out.err and "regular file" in out.err
        assert "hf_not_a_real_token" not in out.out + out.err
    assert (cand / "README.md").is_symlink() and env.read_text() == f"PATH=/usr/bin\n{SECRET}\n"
    assert [p.name for p in cand.iterdir() if p.name.startswith(".")] == []  # no temporary card left


MARKERS = b"<!-- quantize gate: begin -->\n## Quality gate: pass\n<!-- quantize gate: end -->\n"


@pytest.mark.parametrize(
    "readme,says",
    [
        (b"---\nlicense: mit\n---\n# caf\xe9\n", "not UTF-8 text: byte 0xe9 at line 4"),
        (b"---\n- a\n- b\n---\nbody\n", "is a list; a model card's metadata is a mapping"),
        (b"---\nmodel-index: [{name: m, results: [{metrics: []}]}]\n---\n", "not metadata huggingface_hub can read"),
        (b"---\nmodel-index: 5\n---\n", "not metadata huggingface_hub can read"),
        (b"---\nlicense: [mit\n---\n", "not valid YAML"),
        (b"---\na: !!python/object/apply:os.system [echo hi]\n---\n", "not valid YAML"),
        (b"---\na: &x [1]\nb: *x\n---\n", "aliases"),
        (b"# m\n<!-- quantize gate: end -->\n", "holds 0 start markers (<!-- quantize gate: begin -->) and 1 end"),
        (b"# m\n<!-- quantize gate: begin -->\n## Quality gate: pass\n", "holds 1 start marker (<!-- quantize gate"),
        (
            b"---\nlicense: mit\n---\n<!-- quantize gate: end -->\nx\n<!-- quantize gate: begin -->\n",
            "before its start marker",
        ),
        (MARKERS + MARKERS, "holds 2 start markers (<!-- quantize gate: begin -->) and 2 end markers"),
    ],
    ids=["not-utf8", "list", "model-index-entry", "model-index-number", "bad-yaml", "python-tag", "alias"]
    + ["lone-end", "lone-start", "end-first", "two-sections"],
)
def test_a_card_that_cannot_be_read_is_exit_2_before_scoring(
    policy, verdict, tiny_model, tmp_path, capsys, monkeypatch, readme, says
):
    """Each malformed README is exit 2 naming the card and the problem: under `gate --card` before the gate runs
    (it would have scored first, then failed with exit 3 and the verdict lost), and from `card --verdict`."""
    cand = _candidate(tiny_model, tmp_path)
    (cand / "README.md").write_bytes(readme)
    (tmp_path / "v.json").write_text(json.dumps(verdict))
    _no_scoring(monkeypatch)
    for args in (
        ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand), "--card"],
        ["card", str(cand), "--verdict", str(tmp_path / "v.json")],
    ):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert "README.md" in err and says in err and "Traceback" not in err
        assert (cand / "README.md").read_bytes() == readme  # left as it was


def test_the_verdict_is_printed_before_the_card_and_junit_are_written(
    policy, verdict, tiny_model, tmp_path, capsys, monkeypatch
):
    """The card checked before the gate, then broken while it ran (its README swapped for a link): the verdict is on
    stdout, then the card is refused (exit 2), the JUnit file beside it written whole or not at all."""
    cand = _candidate(tiny_model, tmp_path)
    (cand / "README.md").write_text("# Mine\n")
    (tmp_path / "secret").write_text(SECRET)

    def gate_then_swap(*_a, **_k):
        (cand / "README.md").unlink()
        (cand / "README.md").symlink_to(tmp_path / "secret")
        return parse(Verdict, verdict, "the test's verdict")

    monkeypatch.setattr(flows_gate, "run_gate", gate_then_swap)
    junit = tmp_path / "gate.xml"
    args = ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand), "--card", "--json"]
    assert main([*args, "--junit", str(junit)]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out)["verdict"] == "pass" and "symbolic link" in out.err
    assert "hf_not_a_real_token" not in out.out + out.err
    assert ET.parse(junit).getroot().get("tests") == "3"


def test_an_agreement_only_verdict_publishes_its_agreement_and_no_empty_block(verdict, tiny_model, tmp_path):
    """A sequential gate that stopped at an agreement regression before any item (a 3-bit candidate): its card's
    model-index carries the agreement figure that decided it, and a card written from nothing has one front matter
    block and no empty `---`/`---` pair in its body."""
    cand = _candidate(tiny_model, tmp_path)
    v = json.loads(json.dumps(verdict))
    kl = next(r for r in v["rules"] if r["kind"] == "agreement")
    kl["verdict"] = "regression"  # as a far KL gives it: its lower bound past the rule's max
    kl["evidence"].update(value=kl["evidence"]["max"] + 0.4, lower_bound=kl["evidence"]["max"] + 0.3)
    kl["evidence"]["upper_bound"] = kl["evidence"]["max"] + 0.5
    why = "the gate stopped at a regression before this rule's task was scored"
    v["rules"] = [
        {"kind": "untested", "rule": r["rule"], "task": r["task"], "reason": why}
        for r in v["rules"]
        if r["kind"] != "agreement"
    ] + [kl]
    v["verdict"], v["exit_code"] = "rejected", 1
    (tmp_path / "v.json").write_text(json.dumps(v))
    assert main(["card", str(cand), "--verdict", str(_gates_own(tmp_path / "v.json"))]) == 0
    text = (cand / "README.md").read_text()
    card = ModelCard.load(cand / "README.md")
    [r] = card.data.eval_results
    assert (r.task_name, r.metric_type, r.metric_value) == ("agreement", "kl", kl["evidence"]["value"])
    assert r.metric_args["verdict"] == "regression" and r.metric_args["max"] == kl["evidence"]["max"]
    assert r.dataset_name == "core/v1 prompts" and "results: []" not in text
    assert not re.search(r"^---\s*\n---\s*$", card.text, re.M) and text.count("\n---\n") == 1
    assert card.text.lstrip().startswith("<!-- quantize gate: begin -->")
    # written again over the first (and over a card an earlier version left with an empty block): one of each
    (cand / "README.md").write_text(text.replace("---\n\n<!--", "---\n\n---\n---\n\n<!--", 1))
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 0
    again = (cand / "README.md").read_text()
    assert again.count("\n---\n") == 1 and again.count("## Quality gate") == 1


def test_names_in_the_card_are_escaped(verdict, tiny_model, tmp_path):
    """A policy and a rule named to forge a headline, a tag and a table row show as text in the card."""
    cand = _candidate(tiny_model, tmp_path)
    v = json.loads(json.dumps(verdict))
    v["policy"] = "ok\n# PASS <script>alert(1)</script>"
    v["rules"][0]["rule"] = "x | pass |\n## PASS"
    (tmp_path / "v.json").write_text(json.dumps(v))
    assert main(["card", str(cand), "--verdict", str(_gates_own(tmp_path / "v.json"))]) == 0
    body = ModelCard.load(cand / "README.md").text
    assert [line for line in body.splitlines() if line.startswith("#")] == [
        "## Quality gate: pass",
        "### quantize gate `ok\\n# PASS <script>alert(1)</script>`: ✅ PASS",
    ]
    rows = [line for line in body.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 3 and all(len(re.findall(r"(?<!\\)\|", row)) == 8 for row in rows)


def test_a_card_saved_with_a_byte_order_mark_keeps_its_front_matter(tmp_path):
    """A README.md starting with a UTF-8 byte-order mark had its front matter (license, base_model) read as body
    text, so the card written back lost them as metadata."""
    from quantize.report.card import read_card

    (tmp_path / "README.md").write_bytes("\ufeff---\nlicense: mit\nbase_model: org/model\n---\n\n# Hi\n".encode())
    data, body = read_card(tmp_path)
    assert data == {"license": "mit", "base_model": "org/model"} and body.strip() == "# Hi"


def test_a_card_with_crlf_lines_is_rewritten_without_a_stray_carriage_return(verdict, tiny_model, tmp_path):
    """A README.md written with CRLF line ends kept a `\\r` line between its body and the verdict (a review)."""
    cand = _candidate(tiny_model, tmp_path)
    (cand / "README.md").write_bytes(b"---\r\nlicense: mit\r\n---\r\n\r\nMy model.\r\nLine two.\r\n")
    (tmp_path / "v.json").write_text(json.dumps(verdict))
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 0
    raw = (cand / "README.md").read_bytes()
    assert b"\r" not in raw and b"My model.\nLine two.\n\n<!--" in raw, raw[:300]
    assert ModelCard.load(cand / "README.md").data.license == "mit"


@pytest.mark.parametrize(
    "rule,edit,says",
    [
        # a review's forged.json: the candidate's accuracy raised to 0.99, Δ (+0.0), bounds and outcome left
        ("core_facts acc", lambda ev: ev.update(candidate=0.99), "candidate 0.99 − baseline"),
        ("core_prose perplexity", lambda ev: ev.update(candidate_perplexity=ev["baseline_perplexity"] / 2), "ratio"),
        ("agreement kl", lambda ev: ev.update(value=ev["upper_bound"] + 0.1), "outside its own bounds"),
    ],
)
def test_a_verdict_whose_figures_do_not_follow_from_one_another_is_refused(
    verdict, tiny_model, tmp_path, capsys, rule, edit, says
):
    """`card --verdict forged.json` published a candidate of 0.99 above a baseline of 0.25 with a Δ of +0.0 into
    model-index (a review): a verdict's figures must follow from one another as the gate computes them, wherever it
    is read; exit 2 naming the rule, and no card written, even for a verdict the cache holds."""
    forged = json.loads(json.dumps(verdict))
    edit(next(r for r in forged["rules"] if r["rule"] == rule)["evidence"])
    (tmp_path / "v.json").write_text(json.dumps(forged))
    cand = _candidate(tiny_model, tmp_path)
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"rule {rule}'s evidence does not hold together" in err and says in err and "Traceback" not in err
    assert not (cand / "README.md").exists()
    with pytest.raises(ValueError, match="does not hold together"):
        parse(Verdict, forged, "v.json")


def test_the_gates_own_figures_hold_together(verdict):
    """What the gate wrote reads back (the figures' check allows float rounding, not a change): a review's repro."""
    v = parse(Verdict, verdict, "v.json")
    assert [r.evidence.inconsistent() for r in v.rules] == [None, None, None]


def test_a_verdict_no_gate_decided_with_this_cache_publishes_nothing(verdict, tiny_model, tmp_path, capsys):
    """A verdict whose figures hold together but that no gate run with this cache decided (written by hand to read
    0.99, copied from another machine) went into model-index: `card` publishes only a gate's own decision (the cache
    holds it, as the report reads a saved verdict); otherwise exit 2 saying how to publish one, and no card."""
    forged = json.loads(json.dumps(verdict))
    ev = next(r for r in forged["rules"] if r["rule"] == "core_facts acc")["evidence"]
    shift = 0.99 - ev["candidate"]
    ev.update(candidate=0.99, delta=ev["delta"] + shift)
    ev.update(lower_bound=ev["lower_bound"] + shift, upper_bound=ev["upper_bound"] + shift)
    (tmp_path / "v.json").write_text(json.dumps(forged))
    parse(Verdict, forged, "v.json")  # a record that reads: only the cache tells it from a gate's
    cand = _candidate(tiny_model, tmp_path)
    assert main(["card", str(cand), "--verdict", str(tmp_path / "v.json")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is not a gate's own decision" in err and "--card" in err and not (cand / "README.md").exists()
    # the gate's own verdict, re-dumped (as `gate --json` printed it), is published
    (tmp_path / "own.json").write_text(json.dumps(verdict, indent=4))
    assert main(["card", str(cand), "--verdict", str(tmp_path / "own.json")]) == 0
    [facts] = [r for r in ModelCard.load(cand / "README.md").data.eval_results if r.task_name == "core_facts"]
    assert (
        facts.metric_value
        == next(r for r in verdict["rules"] if r["rule"] == "core_facts acc")["evidence"]["candidate"]
    )
