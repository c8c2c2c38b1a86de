"""The output-kind registry (quantize/kinds.py): every record type has exactly one kind, the gate's rules and
the golden manifest read their vocabulary from it, and each kind's summary matches its closed form."""

from __future__ import annotations

import json
import math
import typing

import pytest

from quantize import kinds, records
from quantize.errors import UsageError
from quantize.gates.policy import RULE_OUTPUT_TYPES
from quantize.golden.manifest import OutputType
from quantize.kinds import KINDS


def test_every_task_record_has_one_kind_and_back():
    union = typing.get_args(typing.get_args(records.TaskScores)[0])
    assert {k.task_record for k in KINDS.values()} == set(union)
    for t, k in KINDS.items():
        assert k.task_record.model_fields["output_type"].default == t
    assert set(typing.get_args(OutputType)) == set(KINDS)


def test_rules_accept_exactly_the_kinds_that_produce_their_metric():
    assert RULE_OUTPUT_TYPES["exact_match"] == ("generate_until",)
    assert "loglikelihood_rolling" not in RULE_OUTPUT_TYPES["acc"]
    assert set(RULE_OUTPUT_TYPES["perplexity"]) == {"loglikelihood", "loglikelihood_rolling"}


def _summary(output_type, items, filt=None):
    from quantize.evaluate.score import task_scores

    return task_scores(output_type, 1.0, items, {}, filt)


def test_a_one_item_task_has_no_standard_error_and_is_written():
    """acc_se was √(acc(1−acc)/(n−1)) = inf for n = 1: a record JSON cannot hold (records refuse non-finite)."""
    d = _summary("generate_until", [{"id": "a", "cluster": "a", "score": 1.0, "response": "x"}], "strict")
    assert d.acc == 1.0 and d.acc_se is None
    assert json.loads(json.dumps(d.model_dump(), allow_nan=False))["acc_se"] is None  # what records.to_json does


def test_rolling_summary_is_bits_per_byte_and_word_perplexity():
    items = [
        {"id": "a", "cluster": "a", "score": -10.0, "ll": -10.0, "words": 4, "bytes": 20},
        {"id": "b", "cluster": "b", "score": -6.0, "ll": -6.0, "words": 4, "bytes": 12},
    ]
    d = _summary("loglikelihood_rolling", items)
    assert d.bits_per_byte == pytest.approx(16 / 32 / math.log(2))
    assert d.word_perplexity == pytest.approx(math.exp(16 / 8))
    assert kinds.kind_of(d).headline(d).se is None


def test_choice_summary_chance_and_accuracy():
    items = [
        {"id": "a", "cluster": "a", "score": 1.0, "ll": -1.0, "lls": [-1.0, -2.0]},
        {"id": "b", "cluster": "b", "score": 0.0, "ll": -3.0, "lls": [-1.0, -3.0, -4.0, -5.0]},
    ]
    d = _summary("multiple_choice", items)
    assert d.chance == pytest.approx((1 / 2 + 1 / 4) / 2) and d.acc == 0.5
    assert d.acc_se == pytest.approx(math.sqrt(0.25 / 1))


@pytest.mark.parametrize(
    "item,margin",
    [
        (records.ChoiceItem(id="a", cluster="a", score=1.0, ll=-1.0, lls=[-1.0, -3.5, -2.0]), 1.0),
        (records.ChoiceItem(id="a", cluster="a", score=0.0, ll=-2.0, lls=[-1.0, -2.0]), 1.0),
        # right with p = 0.9: logit ln 9; wrong with p = 0.9 (the target was not the greedy one): −ln 9
        (records.GreedyItem(id="a", cluster="a", score=1.0, ll=math.log(0.9)), math.log(9)),
        (records.GreedyItem(id="a", cluster="a", score=0.0, ll=math.log(0.9)), -math.log(9)),
        (records.DocumentItem(id="a", cluster="a", score=-1.0, ll=-1.0, words=1, bytes=1), None),
    ],
)
def test_the_baseline_margin_of_each_kind(item, margin):
    got = kinds.kind_of_item(item).margin(item)
    assert got == (pytest.approx(margin) if margin is not None else None)


# --- one vocabulary: what reads the kinds reads them from the registry --------------------------------------------


def _type_action():
    from quantize.cli import build_parser

    parser = build_parser()
    golden = next(a for a in parser._subparsers._group_actions[0].choices["golden"]._actions if a.dest == "action")
    new = golden.choices["new"]
    return next(a for a in new._actions if a.dest == "type")


def test_golden_new_offers_exactly_the_registry_s_templates():
    assert (
        list(_type_action().choices)
        == list(kinds.templates())
        == ["multiple_choice", "greedy", "perplexity", "generate"]
    )
    assert {k.template.name: k.output_type for k in kinds.templates().values()}["perplexity"] == "loglikelihood_rolling"


@pytest.fixture
def yes_no(monkeypatch):
    """A kind added to the registry alone: items whose score is `acc` and `yes`, written from {question, answer}."""

    class YesNoItem(records.GreedyItem):
        pass

    def config(_regex, _stop, _max):
        return {"output_type": "yes_no", "doc_to_text": "question", "doc_to_target": "answer", "metric_list": []}

    base = KINDS["loglikelihood"]
    kind = kinds.Kind(
        "yes_no",
        base.task_record,
        YesNoItem,
        right_wrong=True,
        metrics=("acc", "yes"),
        scored_as=("acc", "yes"),
        item=base.item,
        summary=base.summary,
        headline=base.headline,
        template=kinds.Template("yes_no", ("question", "answer"), config),
    )
    monkeypatch.setitem(KINDS, "yes_no", kind)
    return YesNoItem


def test_a_kind_added_to_the_registry_is_seen_by_golden_new(yes_no, tmp_path, capsys):
    from quantize.cli import main

    assert "yes_no" in list(_type_action().choices)
    src = tmp_path / "items.jsonl"
    src.write_text('{"question": "Is water wet?"}\n')
    assert main(["golden", "new", str(tmp_path / "set" / "v1"), "--from", str(src), "--type", "yes_no"]) == 2
    assert "a yes_no item has question, answer" in capsys.readouterr().err  # its template's fields, not argparse's


def test_a_kind_added_to_the_registry_is_seen_by_the_gate(yes_no):
    """The gate takes an item's score for every metric its kind's score is (`scored_as`), not a list of its own."""
    from quantize.gates.gate import item_value

    item = yes_no(id="a", cluster="a", score=1.0, ll=-0.1)
    assert item_value(item, "yes", "t") == 1.0 and item_value(item, "acc", "t") == 1.0
    with pytest.raises(UsageError, match="no per-item perplexity"):
        item_value(item, "perplexity", "t")


def test_building_the_cli_parser_imports_no_registry():
    """--type's choices are read when argparse needs them: every other command starts without pydantic."""
    import subprocess
    import sys

    code = "import sys; from quantize.cli import build_parser; build_parser(); print('quantize.kinds' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
