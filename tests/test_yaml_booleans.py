"""YAML 1.2's booleans in every file the project's loader reads (quantize/config.py): `on`, `off`, `yes` and `no`
are words, so a field that takes them (`streaming: on`, as the docs and the messages write it) gets them; `true`
and `false` are booleans; a boolean field takes either spelling."""

from __future__ import annotations

import re
import tokenize

import pytest

from quantize.config import parse_yaml
from quantize.convert.recipe import load_recipe
from quantize.errors import UsageError
from quantize.gates.policy import load_policy

from conftest import ROOT

RECIPE = "name: r\nmethod: gptq\nscheme: W4A16\nmodel: /no/such/model\n"
POLICY = "suite: s.yaml\nrules:\n  - {task: t, metric: acc, margin: 0.1}\n"
WORDS = {"streaming", "offload"}  # fields whose values are the words auto, on and off
BOOLEANS = {"trust_remote_code", "symmetric", "act_order", "fail_on_inconclusive", "allow_different_tokenizer"}
FSTRING_MIDDLE = getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)  # Python 3.12 splits f-strings
POLICY_FIELDS = {"fail_on_inconclusive", "allow_different_tokenizer"}


def test_yes_no_on_off_are_words_and_true_false_booleans():
    words = ["on", "On", "ON", "off", "Off", "OFF", "yes", "Yes", "YES", "no", "No", "NO", "y", "n"]
    booleans = ["true", "True", "TRUE", "false", "False", "FALSE"]
    got = parse_yaml(f"w: [{', '.join(words)}]\nb: [{', '.join(booleans)}]\n".encode(), "t.yaml")
    assert got == {"w": words, "b": [True] * 3 + [False] * 3}
    # a model card's front matter is read as huggingface_hub reads it: YAML 1.1, `inference: no` is False
    assert parse_yaml(b"inference: no\nx: on\n", "README.md", yaml11_booleans=True) == {"inference": False, "x": True}


def test_a_recipe_with_streaming_on_and_offload_off_loads_and_its_booleans_take_either_spelling(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(RECIPE + "streaming: on\noffload: off\ntrust_remote_code: off\nsymmetric: true\nact_order: no\n")
    r, _ = load_recipe(f)
    assert (r.streaming.value, r.offload.value) == ("on", "off")
    assert (r.trust_remote_code, r.symmetric, r.act_order) == (False, True, False)
    f.write_text(RECIPE + "streaming: true\ntrust_remote_code: maybe\n")
    with pytest.raises(UsageError) as e:
        load_recipe(f)
    assert "streaming = true: Input should be 'auto', 'on' or 'off'" in str(e.value)
    assert 'trust_remote_code = "maybe": Input should be a valid boolean' in str(e.value)


def _documented() -> set[tuple[str, str]]:
    """Every `field: value` the docs, the README, the shipped YAML and the project's own messages (the string
    literals of quantize/) write for the fields above."""
    texts = [p.read_text(encoding="utf-8") for p in [*ROOT.glob("docs/*.md"), ROOT / "README.md"]]
    texts += [
        p.read_text(encoding="utf-8")
        for d in ("recipes", "sweeps", "gates", "evaluate")
        for p in (ROOT / d).glob("*.yaml")
    ]
    for p in ROOT.glob("quantize/**/*.py"):
        with p.open("rb") as f:
            texts += [t.string for t in tokenize.tokenize(f.readline) if t.type in (tokenize.STRING, FSTRING_MIDDLE)]
    fields = "|".join(sorted(WORDS | BOOLEANS))
    return {m for t in texts for m in re.findall(rf"\b({fields}): *((?i:true|false|on|off|yes|no|y|n|auto))\b", t)}


def test_every_documented_spelling_loads_as_written(tmp_path):
    documented = _documented()
    assert {("streaming", "on"), ("offload", "on"), ("trust_remote_code", "true")} <= documented  # the scan reads
    for field, value in sorted(documented):
        f = tmp_path / f"{field}-{value}.yaml"
        f.write_text((POLICY if field in POLICY_FIELDS else RECIPE) + f"{field}: {value}\n")
        loaded = load_policy(f) if field in POLICY_FIELDS else load_recipe(f)[0]
        got = getattr(loaded, field)
        if field in WORDS:
            assert got.value == value, (field, value)
        else:
            assert got is (value.lower() in ("true", "on", "yes")), (field, value)


def test_the_card_reader_keeps_yaml_1_1_booleans(tmp_path):
    """The card's front matter is huggingface_hub's (YAML 1.1): `inference: no` stays False through quantize's
    reading, not the text "no" the core schema would make of it."""
    from quantize.report.card import read_card

    (tmp_path / "README.md").write_text("---\ninference: no\nlicense: mit\n---\n\nText.\n")
    data, body = read_card(tmp_path)
    assert data == {"inference": False, "license": "mit"} and body.strip() == "Text."


def test_a_key_written_twice_in_one_mapping_is_refused_naming_both_lines(tmp_path, capsys):
    """PyYAML keeps the last of a key written twice: a policy's `rules:` written twice lost the first list, a
    sweep's `recipes:` twice planned without them, `{task: x, task: y}` judged y; all silently. Every file the
    project's loader reads refuses it, naming the key and both lines; a model card's front matter is read as
    huggingface_hub reads it (the last counts)."""
    with pytest.raises(UsageError, match=r'the key "rules" is written twice in one mapping \(lines 2 and 4\)'):
        parse_yaml(POLICY.encode() + b"rules: []\n", "p.yaml")
    with pytest.raises(UsageError, match=r'the key "task" is written twice'):
        parse_yaml(b"rules:\n  - {task: x, task: y, margin: 0.1}\n", "p.yaml")
    assert parse_yaml(b"a: {b: 1}\nc: {b: 2}\n", "t.yaml") == {"a": {"b": 1}, "c": {"b": 2}}  # one per mapping
    assert parse_yaml(b"license: mit\nlicense: apache-2.0\n", "README.md", yaml11_booleans=True) == {
        "license": "apache-2.0"
    }
    f = tmp_path / "p.yaml"
    f.write_text(POLICY + "rules: []\n")
    with pytest.raises(UsageError, match="written twice"):
        load_policy(f)
