"""Names that become one part of a path (quantize/names.py): every rule refuses what it names with a UsageError
that shows the value escaped, a good name comes back NFC, and two names one file system would merge are refused
with both sources named."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from quantize.errors import UsageError
from quantize.names import PathPart, checked, key, problem, shown, unique

BAD = [
    ("/tmp/abs", "path separator"),
    ("../UP", "path separator"),
    ("a/", "path separator"),
    ("./a", "path separator"),
    ("a\\b", "path separator"),
    ("", "is empty"),
    (".", "folder itself or its parent"),
    ("..", "folder itself or its parent"),
    (".hidden", "starts with '.'"),
    ("local\n", "control character"),
    ("a\x00b", "control character"),
    ("a\u200bb", "invisible"),
    ("a\u202eb", "invisible"),  # right-to-left override: a name that reads as another
    ("a\u2028b", "line separator"),
    ("\ud800", "lone surrogate"),
    ("ok\udcff", "lone surrogate"),  # a non-UTF-8 byte of a file name, as Python decodes it
    (" a", "whitespace"),
    ("a\u3000", "whitespace"),
    ("a" * 101, "at most 100"),
    ("é" * 101, "at most 100"),
    ("語" * 70, "200 bytes"),  # 70 characters, 210 bytes
    ("a" * 100_000, "at most 100"),
    (3, "not text"),
]


@pytest.mark.parametrize("value,says", BAD, ids=[repr(b[0])[:20] for b in BAD])
def test_each_rule_refuses_with_the_field_the_value_and_the_fix(value, says):
    with pytest.raises(UsageError) as e:
        checked(value, "recipes[3].name", "set `name:` to a plain word")
    msg = str(e.value)
    assert says in msg and msg.startswith("recipes[3].name = ") and msg.endswith("set `name:` to a plain word")
    assert "\n" not in msg and len(msg) < 600  # one line, bounded whatever was given
    msg.encode("utf-8")  # printable: a lone surrogate is shown escaped, never written


@pytest.mark.parametrize(
    "value", ["w8", "gptq-w4a16-g128", "my recipe", "x[1]*?", "日本語", "a.b", "a" * 100, "é" * 100]
)
def test_good_names_pass_as_they_are(value):
    assert problem(value) is None and checked(value, "f", "") == value


def test_a_name_comes_back_nfc_and_case_folds_for_comparison():
    decomposed = "cafe\u0301"  # e + combining acute
    assert checked(decomposed, "f", "") == "caf\u00e9"
    assert key("CAFÉ") == key(decomposed) == key("café")


def test_shown_escapes_what_would_not_print_as_itself():
    assert shown('a\n"b\\\ud800\u200b') == '"a\\u000a\\"b\\\\\\ud800\\u200b"'
    assert shown("x" * 100, limit=5) == '"xxxxx"…' and shown(None) == "None"


def test_unique_names_both_sources_of_one_name():
    unique([("w8", "a.yaml"), ("w4", "b.yaml")], "candidates", "rename one")
    with pytest.raises(UsageError, match=r'named "w8": a\.yaml and c\.yaml\. Their outputs would share one folder'):
        unique([("w8", "a.yaml"), ("w4", "b.yaml"), ("w8", "c.yaml")], "candidates", "rename one")
    with pytest.raises(UsageError, match=r'"W8" and "w8" \(one name on a case-insensitive file system\): a and b'):
        unique([("W8", "a"), ("w8", "b")], "candidates", "rename one")


def test_path_part_is_the_same_rule_in_a_schema():
    class M(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: PathPart

    assert M(name="cafe\u0301").name == "caf\u00e9"
    for value in ("../UP", "\ud800", ""):
        with pytest.raises(ValidationError, match="a name is one folder or file name"):
            M(name=value)


def test_path_text_takes_any_path_a_file_system_can_hold():
    from quantize.names import PathText

    class M(BaseModel):
        model_config = ConfigDict(extra="forbid")
        output: PathText

    assert M(output="../outs/a b/日本").output == "../outs/a b/日本"
    for value, says in (("out\x00x", "control characters"), ("o\n", "control characters"), ("\ud800", "surrogate")):
        with pytest.raises(ValidationError, match=says):
            M(output=value)
    with pytest.raises(ValidationError, match="empty path"):
        M(output="")
