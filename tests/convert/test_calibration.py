"""Calibration sources (issue 46): chat data through the checkpoint's chat template, parquet, saved datasets and
weighted mixtures, each converting on the tiny model, each bad one refused before any model loads, and what the
calibration saw recorded in quantize.json."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from convert.test_engine import run_ok, write_recipe

from quantize import records
from quantize.cli import main
from quantize.convert import engine
from quantize.convert.calibration import build_calibration, shares
from quantize.convert.recipe import Calibration, parse_recipe
from quantize.convert.render import calibration_lines
from quantize.errors import UsageError
from quantize.io import sha256_bytes
from quantize.records import CalibrationRecord

from conftest import ROOT

# "role : content" a message: the template adds exactly two tokens a message with the tests' word-level tokenizer
TEMPLATE = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }}\n{% endfor %}"
FP8 = dict(method="fp8", scheme="FP8")  # a calibrated scheme that converts fast
WORDS = [
    "the",
    "hacker",
    "wrote",
    "a",
    "program",
    "for",
    "the",
    "system",
    "and",
    "the",
    "user",
    "ran",
    "it",
    "on",
    "a",
    "machine",
    "of",
    "the",
    "lab",
]


def sentence(i: int, n: int = 12) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))


def conversations(n: int = 40) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": sentence(i, 6)}, {"role": "assistant", "content": sentence(i + 3, 10)}]
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def chat_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny model with a chat template on its tokenizer (the tests' tokenizer has none)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("chat") / "tiny-chat"
    shutil.copytree(tiny_model, folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(folder))
    return folder


@pytest.fixture
def sources(tmp_path) -> dict[str, Path]:
    """One source of each kind, built here."""
    import datasets

    chats = conversations()
    texts = [sentence(i, 20) for i in range(40)]
    out = {
        "chat-jsonl": write_jsonl(tmp_path / "chat.jsonl", [{"messages": m, "id": i} for i, m in enumerate(chats)]),
        "text-jsonl": write_jsonl(tmp_path / "text.jsonl", [{"body": t} for t in texts]),
        "parquet": tmp_path / "chat.parquet",
        "dataset": tmp_path / "ds",
        "dataset-dict": tmp_path / "dsd",
    }
    datasets.Dataset.from_dict({"messages": chats}).to_parquet(str(out["parquet"]))
    datasets.Dataset.from_dict({"text": texts, "n": list(range(40))}).save_to_disk(str(out["dataset"]))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": texts}), "val": datasets.Dataset.from_dict({"text": texts[:3]})}
    ).save_to_disk(str(out["dataset-dict"]))
    return out


CAL = dict(samples=4, seq_len=32, seed=0)


def calibrations(s: dict[str, Path]) -> dict[str, dict]:
    return {
        "chat-jsonl": dict(source=str(s["chat-jsonl"]), **CAL),
        "text-jsonl": dict(source=str(s["text-jsonl"]), text_field="body", **CAL),
        "parquet": dict(source=str(s["parquet"]), **CAL),
        "dataset": dict(source=str(s["dataset"]), **CAL),
        "dataset-dict": dict(source=str(s["dataset-dict"]), split="train", **CAL),
        "golden": dict(source=str(ROOT / "golden" / "std" / "v1"), task="arc_easy", **CAL),
        "mixture": dict(
            mixture=[
                {"source": str(s["chat-jsonl"]), "weight": 0.75},
                {"source": str(s["dataset"]), "weight": 0.25},
            ],
            **CAL,
        ),
    }


EXPECT = {  # kind and column each source is read as
    "chat-jsonl": [("chat", "messages")],
    "text-jsonl": [("text", "body")],
    "parquet": [("chat", "messages")],
    "dataset": [("text", "text")],
    "dataset-dict": [("text", "text")],
    "golden": [("text", None)],
    "mixture": [("chat", "messages"), ("text", "text")],
}


@pytest.mark.parametrize("kind", list(EXPECT))
def test_each_source_kind_converts(tmp_path, chat_model, sources, capsys, kind):
    meta = run_ok(write_recipe(tmp_path, chat_model, kind, **FP8, calibration=calibrations(sources)[kind]), capsys)
    cal = meta["calibration"]
    assert [(s["kind"], s["field"]) for s in cal["sources"]] == EXPECT[kind]
    assert cal["tokens"] == 4 * 32 and sum(s["samples"] for s in cal["sources"]) == 4
    d = cal["document_tokens"]
    assert 0 < d["min"] <= d["median"] <= d["max"] and d["total"] >= cal["documents_used"] * d["min"]
    chat = any(k == "chat" for k, _ in EXPECT[kind])
    assert (cal["chat_template_sha256"] is not None) == chat
    if kind == "mixture":
        assert [s["samples"] for s in cal["sources"]] == [3, 1]


def test_chat_is_rendered_through_the_checkpoints_template(tmp_path, chat_model, sources, capsys):
    """The template's sha256 is recorded, and the tokens it adds are counted: 2 a message, 2 messages a
    conversation, so 4 a document of the documents used."""
    recipe = write_recipe(tmp_path, chat_model, "chat", **FP8, calibration=calibrations(sources)["chat-jsonl"])
    assert main(["run", str(recipe)]) == 0
    printed = capsys.readouterr().out
    meta = records.read(records.RunRecord, tmp_path / "out" / "chat" / "quantize.json")
    cal = meta.calibration
    assert cal.chat_template_sha256 == sha256_bytes(TEMPLATE.encode())
    assert cal.chat_template_tokens == 4 * cal.documents_used
    assert cal.chat_template_share == pytest.approx(cal.chat_template_tokens / cal.document_tokens.total)
    # a conversation's rendered tokens: 2 roles + 2 colons + 6 + 10 content words
    assert cal.document_tokens.min == cal.document_tokens.max == 20
    assert f"{cal.documents_used} documents" in printed and "chat template: 20.0% of the tokens" in printed


def test_chat_tokens_are_the_rendered_conversation(tiny_model, sources):
    """The packed ids are the template's rendering, not the raw contents joined."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.chat_template = TEMPLATE
    x = build_calibration(tok, Calibration(source=str(sources["chat-jsonl"]), samples=1, seq_len=16)).input_ids
    colon, user, assistant = (tok.convert_tokens_to_ids(t) for t in (":", "user", "assistant"))
    row = x[0].tolist()
    assert row[:2] == [user, colon] and row[8:10] == [assistant, colon]


def test_a_mixture_is_deterministic_under_its_seed_and_follows_its_weights(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": " ".join(["the"] * (10 + i))} for i in range(30)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": " ".join(["of"] * (10 + i))} for i in range(30)])

    def build(seed: int, wa: float = 0.75):
        mix = [{"source": str(a), "weight": wa}, {"source": str(b), "weight": 1 - wa}]
        return build_calibration(tok, Calibration(mixture=mix, samples=8, seq_len=16, seed=seed))

    one, again, other = build(0), build(0), build(1)
    assert one.record.token_sha256 == again.record.token_sha256 != other.record.token_sha256
    of = tok.convert_tokens_to_ids("of")

    def rows_from_b(x) -> list[int]:
        return [i for i, row in enumerate(x.input_ids.tolist()) if of in row]

    assert len(rows_from_b(one)) == 2  # 0.25 of 8 rows
    # the rows are shuffled with the seed, not stacked source after source: seed 1 puts b's two rows at 1 and 4
    assert rows_from_b(other) == [1, 4]
    assert [s.samples for s in one.record.sources] == [6, 2]
    assert [s.samples for s in build(0, 0.5).record.sources] == [4, 4]


def test_shares_are_largest_remainders():
    assert shares([0.7, 0.3], 10) == [7, 3]
    assert shares([1, 1, 1], 4) == [2, 1, 1]
    assert shares([0.999, 0.001], 4) == [4, 0]
    assert shares([2, 1], 7) == [5, 2]  # 4.67, 2.33: the larger remainder takes the row


# --- refused before any model load -------------------------------------------------------------------


def bad_cases(s: dict[str, Path], tmp: Path) -> dict[str, tuple[dict, str]]:
    (tmp / "plain-folder").mkdir()
    bad_chat = write_jsonl(tmp / "bad.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}, {"messages": "hi"}])
    no_role = write_jsonl(tmp / "norole.jsonl", [{"messages": [{"speaker": "user", "text": "hi"}]}])
    return {
        "missing path": ({"source": str(tmp / "nope.jsonl")}, "calibration.source = '.*nope.jsonl': no such file"),
        "not a saved dataset": ({"source": str(tmp / "plain-folder")}, "not a dataset saved by datasets"),
        "missing column": (
            {"source": str(s["text-jsonl"]), "text_field": "txt"},
            "calibration.text_field = 'txt': .* has no such column; its columns are 'body'",
        ),
        "no default column": ({"source": str(s["text-jsonl"])}, "no 'messages' or 'text' column .*text_field"),
        "dataset column": (
            {"source": str(s["dataset"]), "messages_field": "turns"},
            "calibration.messages_field = 'turns': .* its columns are 'text', 'n'",
        ),
        "messages not a list": ({"source": str(bad_chat)}, r"bad.jsonl:2, column 'messages' is not a conversation"),
        "messages without role": ({"source": str(no_role)}, "message 0 is .*speaker"),
        "parquet text as messages": (
            {"source": str(s["dataset"]), "messages_field": "text"},
            "column 'text' is of type string, not lists of {role",
        ),
        "split": (
            {"source": str(s["dataset-dict"]), "split": "test"},
            "split = 'test': .* has no 'test' split; its splits are 'train', 'val'",
        ),
        "zero weight": (
            {"mixture": [{"source": str(s["dataset"]), "weight": 0}]},
            r"calibration.mixture.0.weight = 0: .*above 0",
        ),
        "negative weight": (
            {"mixture": [{"source": str(s["dataset"]), "weight": 1}, {"source": str(s["parquet"]), "weight": -1}]},
            r"calibration.mixture.1.weight = -1",
        ),
        "mixture source missing": (
            {"mixture": [{"source": str(s["dataset"]), "weight": 1}, {"source": str(tmp / "x.parquet"), "weight": 1}]},
            r"calibration.mixture.1.source = '.*x.parquet': no such file",
        ),
        "source and mixture": (
            {"source": str(s["dataset"]), "mixture": [{"source": str(s["dataset"]), "weight": 1}]},
            "source .* and mixture are both given",
        ),
        "golden without task": (
            {"source": str(ROOT / "golden" / "std" / "v1")},
            "calibration.task is not given; name one of its tasks: arc_easy, gsm8k, hellaswag, lambada_openai",
        ),
        "task of no golden set": (
            {"source": str(s["dataset"]), "task": "arc_easy"},
            "calibration.task = 'arc_easy': .* is not a golden-set version",
        ),
        "txt with a column": (
            {"source": str(write_text(tmp / "a.txt")), "text_field": "x"},
            "is a .txt file.*remove text_field",
        ),
    }


def write_text(path: Path) -> Path:
    path.write_text("some text\n\nmore text")
    return path


@pytest.mark.parametrize(
    "case",
    [
        "missing path",
        "not a saved dataset",
        "missing column",
        "no default column",
        "dataset column",
        "messages not a list",
        "messages without role",
        "parquet text as messages",
        "split",
        "zero weight",
        "negative weight",
        "mixture source missing",
        "source and mixture",
        "golden without task",
        "task of no golden set",
        "txt with a column",
    ],
)
def test_a_bad_source_is_exit_2_before_any_model_load(tmp_path, chat_model, sources, capsys, monkeypatch, case):
    def no_load(*a, **k):
        raise AssertionError("a model was loaded for a bad calibration source")

    monkeypatch.setattr(engine, "_convert", no_load)
    fields, said = bad_cases(sources, tmp_path)[case]
    recipe = write_recipe(tmp_path, chat_model, "bad", **FP8, calibration={**fields, "samples": 4, "seq_len": 32})
    assert main(["run", str(recipe), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert re.search(said, err), err
    assert "Traceback" not in err


def test_conversations_need_a_chat_template(tmp_path, tiny_model, sources, capsys, monkeypatch):
    """The tests' tokenizer has no chat template: a chat source is refused from the files, before a load."""
    monkeypatch.setattr(engine, "_convert", lambda *a, **k: pytest.fail("a model was loaded"))
    recipe = write_recipe(tmp_path, tiny_model, "nochat", **FP8, calibration=calibrations(sources)["chat-jsonl"])
    assert main(["run", str(recipe), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds conversations" in err and "has none" in err and "text_field" in err


def test_a_source_file_is_read_as_a_regular_file(tmp_path, tiny_model, capsys, monkeypatch):
    """A FIFO named as a source is refused, never read (read_user_file)."""
    import os

    monkeypatch.setattr(engine, "_convert", lambda *a, **k: pytest.fail("a model was loaded"))
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    recipe = write_recipe(tmp_path, tiny_model, "fifo", **FP8, calibration={"source": str(fifo)})
    assert main(["run", str(recipe), "--quiet"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_the_recipe_schema_refuses_two_fields_for_one_source():
    with pytest.raises(UsageError, match="text_field 'a' and messages_field 'b' are both given"):
        parse_recipe({**FP8, "calibration": {"source": "x.jsonl", "text_field": "a", "messages_field": "b"}})
    with pytest.raises(UsageError, match="belong to each source of a mixture"):
        parse_recipe({**FP8, "calibration": {"mixture": [{"source": "x", "weight": 1}], "text_field": "a"}})
    assert parse_recipe({**FP8}).calibration.source == "builtin:jargon"  # the default is unchanged


def test_a_record_written_before_these_fields_still_reads():
    old = dict(
        source="builtin:jargon",
        description="Jargon",
        samples=4,
        seq_len=32,
        seed=0,
        documents_used=3,
        tokens=128,
        token_sha256="0" * 64,
    )
    rec = CalibrationRecord.model_validate(old)
    assert rec.sources == [] and rec.document_tokens is None and rec.chat_template_sha256 is None
    assert calibration_lines(rec) == ["  calibration: 4 × 32 tokens from 3 documents of builtin:jargon"]


@pytest.mark.parametrize("task", ["arc_easy", "hellaswag", "gsm8k", "lambada_openai"])
def test_a_golden_tasks_items_are_its_doc_to_text(task):
    """Each item as lm-eval's own doc_to_text gives it (a field, or a Jinja template: lambada's splits and joins)."""
    from lm_eval.utils import apply_template

    from quantize.convert.calibration import open_source
    from quantize.convert.recipe import MixtureSource

    root = ROOT / "golden" / "std" / "v1"
    src = open_source(MixtureSource(source=str(root), weight=1, task=task), "calibration.source")
    template = yaml.safe_load((root / "tasks" / f"{task}.yaml").read_text())["doc_to_text"]
    docs = [json.loads(line) for line in (root / "data" / f"{task}.jsonl").read_text().splitlines()]
    assert src.rows == len(docs) and src.kind == "text"
    assert [src.row(i) for i in range(src.rows)] == [apply_template(template, d) for d in docs]


def test_the_vocabulary_overlap_with_a_golden_set(tiny_model):
    """Shares of the golden items' distinct token ids, and of their occurrences, found among the packed ids."""
    from lm_eval.utils import apply_template
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    root = ROOT / "golden" / "std" / "v1"
    built = build_calibration(tok, Calibration(samples=2, seq_len=64, overlap_with=str(root)))
    o = built.record.overlap
    packed = set(built.input_ids.flatten().tolist())
    golden = []
    for task in ("arc_easy", "gsm8k", "hellaswag", "lambada_openai"):
        template = yaml.safe_load((root / "tasks" / f"{task}.yaml").read_text())["doc_to_text"]
        for line in (root / "data" / f"{task}.jsonl").read_text().splitlines():
            golden += tok(apply_template(template, json.loads(line)), add_special_tokens=False)["input_ids"]
    assert o.tasks == ["arc_easy", "gsm8k", "hellaswag", "lambada_openai"] and o.distinct_tokens == len(set(golden))
    assert o.distinct_share == pytest.approx(len(set(golden) & packed) / len(set(golden)))
    assert o.token_share == pytest.approx(sum(i in packed for i in golden) / len(golden))
    assert 0 < o.distinct_share < o.token_share < 1  # the frequent tokens are the ones 128 tokens of text hold
    assert "vocabulary of" in calibration_lines(built.record)[-1]


def test_overlap_with_must_be_a_golden_set(tmp_path, tiny_model, capsys, monkeypatch):
    monkeypatch.setattr(engine, "_convert", lambda *a, **k: pytest.fail("a model was loaded"))
    recipe = write_recipe(tmp_path, tiny_model, "ov", **FP8, calibration={"overlap_with": str(tmp_path)})
    assert main(["run", str(recipe), "--quiet"]) == 2
    assert "calibration.overlap_with = " in capsys.readouterr().err
