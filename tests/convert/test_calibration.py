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


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def not_utf8_parquet(tmp: Path) -> Path:
    """A parquet file whose string column holds bytes that are not UTF-8 (pyarrow writes them unchecked)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = b"good text\xff\xfebad"
    offsets = pa.py_buffer(pa.array([0, 9, len(data)], type=pa.int32()).buffers()[1])
    col = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(data)])
    pq.write_table(pa.table({"text": col}), str(tmp / "bad.parquet"))
    return tmp / "bad.parquet"


def not_utf8_dataset(tmp: Path) -> Path:
    """A save_to_disk folder whose second row's bytes were made invalid UTF-8 in its Arrow file."""
    import datasets

    folder = tmp / "bad-ds"
    datasets.Dataset.from_dict({"text": ["good row", "MARKER row"]}).save_to_disk(str(folder))
    (arrow,) = folder.glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes().replace(b"MARKER", b"\xff\xfeRKER"))
    return folder


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
        # text that is not text: exit 3 from pyarrow's decoder or the tokenizer (a review's repros)
        "parquet not utf-8": ({"source": str(not_utf8_parquet(tmp))}, "not a readable parquet file .*UTF8"),
        "dataset not utf-8": (
            {"source": str(not_utf8_dataset(tmp))},
            "column 'text' of rows 0 to 1 .* is not valid Arrow data .*Invalid UTF8 sequence at string index 1",
        ),
        "lone surrogate": (
            {"source": str(write_lines(tmp / "sur.jsonl", ['{"text": "ok"}', '{"text": "a\\ud800b"}']))},
            "sur.jsonl:2 holds a lone surrogate escape",
        ),
        # the documents of golden/core's cloze and prose items: calibrating on them flatters the gate (a review)
        "held-out split": ({"source": "builtin:jargon-heldout"}, "is the held-out split, for measuring only"),
        "held-out in a mixture": (
            {"mixture": [{"source": "builtin:jargon", "weight": 1}, {"source": "builtin:jargon-heldout", "weight": 1}]},
            "calibration.mixture.1.source = 'builtin:jargon-heldout' is the held-out split",
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
        "held-out split",
        "held-out in a mixture",
        "parquet not utf-8",
        "dataset not utf-8",
        "lone surrogate",
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


# --- issue 55: a saved dataset's own files, checks before the load, signals ------------------------------------

ARROW = "data-00000-of-00001.arrow"


def no_model_load(monkeypatch) -> None:
    monkeypatch.setattr(engine, "_convert", lambda *a, **k: pytest.fail("a model was loaded"))


def refused(tmp_path, model, capsys, calibration: dict) -> str:
    """`quantize run` on the calibration: exit 2 in under 2 s (in-process, no model load); the message."""
    import time

    recipe = write_recipe(tmp_path, model, "bad", **FP8, calibration={"samples": 4, "seq_len": 32, **calibration})
    t0 = time.perf_counter()
    code = main(["run", str(recipe), "--quiet"])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and took < 2.0, (took, err)
    return err


def special(path: Path, kind: str, outside: Path) -> None:
    """Put a FIFO, a link to /dev/zero, a folder, or a link to a copy outside the folder where `path` was."""
    import os

    if kind == "link out" and path.is_dir():
        shutil.copytree(path, outside)
    elif kind == "link out":
        shutil.copy(path, outside)
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to(outside)


SPECIAL = [
    (name, kind)
    for name in (ARROW, "state.json", "dataset_info.json", "dataset_dict.json", "train")
    for kind in ("fifo", "/dev/zero", "folder", "link out")
    if (name, kind) != ("train", "folder")  # a split is a folder
]
WHY = {
    "fifo": "not a regular file",
    "/dev/zero": "leads outside",
    "folder": "a folder, not a file",
    "link out": "leads outside",
}


@pytest.mark.parametrize("name,kind", SPECIAL)
def test_every_file_of_a_saved_dataset_is_read_the_safe_way(
    tmp_path, tiny_model, sources, capsys, monkeypatch, name, kind
):
    """A FIFO data file hung `quantize run` before the load (datasets opened it in its thread pool); every file the
    folder names is now a regular file inside it, or exit 2 naming it, before any library opens it."""
    no_model_load(monkeypatch)
    folder = sources["dataset-dict"] if name in ("dataset_dict.json", "train") else sources["dataset"]
    special(folder / name, kind, tmp_path / f"outside-{name}")
    err = refused(tmp_path, tiny_model, capsys, {"source": str(folder)})
    why = "is not a folder" if (name, kind) == ("train", "fifo") else WHY[kind]
    assert str(folder / name) in err and why in err, err


FORGED = {  # file: its text, and what the message must name (the file is named in every case)
    "state.json: not JSON": ("state.json", '{"_data_files": [', "is not JSON"),
    "state.json: a list": ("state.json", "[]", r"\(top level\) = \[\]"),
    "state.json: no _data_files": ("state.json", "{}", "_data_files = null"),
    "state.json: _data_files a string": ("state.json", json.dumps({"_data_files": ARROW}), '_data_files = "data-'),
    "state.json: _data_files empty": ("state.json", json.dumps({"_data_files": []}), r"_data_files = \[\]"),
    "state.json: an entry a list": ("state.json", json.dumps({"_data_files": [[ARROW]]}), r"_data_files\[0\] = a list"),
    "state.json: filename a number": (
        "state.json",
        json.dumps({"_data_files": [{"filename": 3}]}),
        r"_data_files\[0\].filename = 3",
    ),
    "state.json: filename with ..": (
        "state.json",
        json.dumps({"_data_files": [{"filename": f"../ds/{ARROW}"}]}),
        r"_data_files\[0\].filename = \"../ds/.*not a path inside",
    ),
    "state.json: filename absolute": (
        "state.json",
        json.dumps({"_data_files": [{"filename": "/etc/hostname"}]}),
        r"_data_files\[0\].filename = \"/etc/hostname\" is not a path inside",
    ),
    "dataset_info.json: a list": ("dataset_info.json", "[]", r"\(top level\) = \[\] is not an object"),
    "dataset_info.json: features a list": (
        "dataset_info.json",
        '{"features": []}',
        r"features = \[\] is not an object",
    ),
    "dataset_info.json: not UTF-8": ("dataset_info.json", b'{"description": "\xff"}', "not UTF-8 text: byte 0xff"),
    "dataset_dict.json: a list": ("dataset_dict.json", "[]", r"\(top level\) = \[\]"),
    "dataset_dict.json: no splits": ("dataset_dict.json", "{}", "splits = null"),
    "dataset_dict.json: splits a string": ("dataset_dict.json", '{"splits": "train"}', 'splits = "train"'),
    "dataset_dict.json: a split a number": ("dataset_dict.json", '{"splits": ["train", 1]}', r"splits\[1\] = 1"),
    "dataset_dict.json: a split with ..": (
        "dataset_dict.json",
        '{"splits": ["train", "../ds"]}',
        r"splits\[1\] = \"../ds\" is not the name of a folder inside",
    ),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_forged_dataset_metadata_is_exit_2_naming_the_file_and_field(
    tmp_path, tiny_model, sources, capsys, monkeypatch, case
):
    """Each ended in exit 3 (TypeError, AttributeError, IndexError from datasets), in exit 2 naming neither the
    file nor the field, or (`..`, an absolute path) read a file outside the folder; now exit 2 naming both."""
    no_model_load(monkeypatch)
    name, text, said = FORGED[case]
    folder = sources["dataset-dict"] if name == "dataset_dict.json" else sources["dataset"]
    if isinstance(text, bytes):
        (folder / name).write_bytes(text)
    else:
        (folder / name).write_text(text)
    err = refused(tmp_path, tiny_model, capsys, {"source": str(folder)})
    assert f"{folder / name}" in err and re.search(said, err), err


def chat_checkpoint(base: Path, model: Path, template: str) -> Path:
    """`model` with `template` as its chat_template.jinja."""
    folder = base / "templated"
    shutil.copytree(model, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


def test_a_template_that_raises_or_does_not_parse_is_refused_before_the_load(
    tmp_path, tiny_model, sources, capsys, monkeypatch
):
    """Rendered on every conversation the calibration reads, with the tokenizer from the checkpoint's files: a
    template that raises (raise_exception, a Python error) or does not parse was exit 3 after the model loaded."""
    no_model_load(monkeypatch)
    for n, (template, said) in enumerate(
        (
            ("{{ raise_exception('Conversation roles must alternate') }}", "TemplateError: Conversation roles must"),
            ("{% for m in messages %}{{ m.content }", "TemplateSyntaxError"),
            ("{{ messages[0]['content'] + 1 }}", "TypeError"),
            ("{% for m in messages %}{{ m.content }}{% endfor %}{{ 1 / 0 }}", "ZeroDivisionError"),
        )
    ):
        model = chat_checkpoint(tmp_path / str(n), tiny_model, template)
        err = refused(tmp_path, model, capsys, {"source": str(sources["chat-jsonl"])})
        assert "calibration.source = " in err and "chat template does not render row" in err and said in err, err


def test_conversations_checked_before_the_load(tmp_path, chat_model, sources, capsys, monkeypatch):
    """Empty contents, a null inside a parquet conversation, a null inside a saved dataset's conversation: each was
    exit 2 only after the model loaded (or exit 3), now before it, naming the source, row and column."""
    import datasets

    no_model_load(monkeypatch)
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"messages": [{"role": "user", "content": " "}]}] * 3)
    err = refused(tmp_path, chat_model, capsys, {"source": str(empty)})
    assert "empty.jsonl:1, column 'messages'" in err and "every message's content is empty" in err
    chats = conversations(8)
    chats[5] = [{"role": "user", "content": None}]
    datasets.Dataset.from_dict({"messages": chats}).to_parquet(str(tmp_path / "nulls.parquet"))
    err = refused(tmp_path, chat_model, capsys, {"source": str(tmp_path / "nulls.parquet")})
    assert "nulls.parquet, row 5, column 'messages' is not a conversation (message 0 is" in err and "null" in err
    chats = conversations(4)
    chats[2] = [{"role": "assistant", "content": None}]
    datasets.Dataset.from_dict({"messages": chats}).save_to_disk(str(tmp_path / "nulls-ds"))
    err = refused(tmp_path, chat_model, capsys, {"source": str(tmp_path / "nulls-ds"), "samples": 1, "seq_len": 70})
    assert "row 2, column 'messages' is not a conversation" in err


def test_mixture_shares_and_weights_checked_before_the_load(tmp_path, tiny_model, sources, capsys, monkeypatch):
    """A mixture source too small for its share of the tokens (exit 2 only after the load) and weights whose sum
    overflows (1e308 + 1e308 = inf: every share NaN, exit 3 after the load)."""
    no_model_load(monkeypatch)
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": "the hacker"}])
    mix = [{"source": str(sources["dataset"]), "weight": 1}, {"source": str(small), "weight": 1}]
    err = refused(tmp_path, tiny_model, capsys, {"mixture": mix})
    assert "calibration.mixture.1.source = " in err and "holds 3 tokens, fewer than samples × seq_len = 64" in err
    mix = [{"source": str(sources["dataset"]), "weight": 1e308}, {"source": str(sources["dataset"]), "weight": 1e308}]
    err = refused(tmp_path, tiny_model, capsys, {"mixture": mix})
    assert "calibration.mixture: the weights (1e+308, 1e+308) sum to inf" in err
    with pytest.raises(UsageError, match="sum to inf"):
        build_calibration(None, Calibration(mixture=mix, samples=2, seq_len=16))


def test_the_file_tokenizer_packs_as_the_loaded_tokenizer(tmp_path, tiny_model, sources):
    """The pre-load check's tokenizer (tokenizer.json through `tokenizers`, the template through transformers'
    environment rebuilt from jinja2) gives the loaded tokenizer's ids, EOS and renderings, so what it refuses is
    what the run would refuse."""
    from transformers import AutoTokenizer

    from quantize.convert.calibration import file_tokenizer

    template = (
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 3 %}{% break %}{% endif %}\n"
        "  {% generation %}{{ m['role'] | upper }}: {{ m['content'] }} {{ m | tojson }}{% endgeneration %}\n"
        "{% endfor %}{{ eos_token }}{{ unk_token }}"
    )
    model = chat_checkpoint(tmp_path, tiny_model, template)
    # a named token from the legacy special_tokens_map.json, in its AddedToken form
    (model / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<eos>", "lstrip": False}}))
    loaded, mine = AutoTokenizer.from_pretrained(str(model)), file_tokenizer(model)
    assert mine.eos_token_id == loaded.eos_token_id and mine.get_chat_template() == loaded.get_chat_template()
    chats = [*conversations(5), [{"role": "user", "content": 'a "quoted" <b>tag</b> é'}] * 5]
    for chat in chats:
        assert mine.apply_chat_template(chat) == loaded.apply_chat_template(chat, tokenize=False)
    for text in [sentence(i) for i in range(10)] + ["  spaces\tand\nlines", "<eos> inside", "unknownword"]:
        assert mine(text)["input_ids"] == loaded(text, add_special_tokens=False)["input_ids"]
    cal = Calibration(source=str(sources["chat-jsonl"]), samples=3, seq_len=32)
    assert build_calibration(mine, cal).record == build_calibration(loaded, cal).record


SIGNAL_CHILD = """
import sys
from concurrent.futures import ThreadPoolExecutor
from quantize.cli import main
from quantize.convert import calibration

def read_in_a_worker(path, where):  # as datasets did: its thread pool opens each data file
    print("opening", flush=True)
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda p: open(p, "rb").read(), [path]))

calibration._arrow_batches = read_in_a_worker
sys.exit(main(["run", sys.argv[1], "--quiet"]))
"""


@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_ends_a_run_blocked_on_a_fifo_within_seconds(tmp_path, tiny_model, sources, sig, code):
    """SIGTERM was ignored in 3 of 6 runs of `quantize run` blocked on a FIFO (once for 11 minutes): the signal
    unwound the main thread, but concurrent.futures and then the interpreter's exit joined the worker thread
    blocked opening the FIFO. A data file's reader that opens it in a worker thread (what datasets did, before
    the files were checked) on a FIFO: the run ends within 5 s with the signal's exit code."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    special(sources["dataset"] / ARROW, "fifo", tmp_path)
    recipe = write_recipe(tmp_path, tiny_model, "blocked", **FP8, calibration={"source": str(sources["dataset"])})
    p = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_CHILD, str(recipe)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a terminal's command gets SIGINT
    )
    try:
        assert select.select([p.stdout], [], [], 60)[0] and p.stdout.readline().strip() == "opening"
        time.sleep(0.2)  # the worker thread blocks opening the FIFO (a signal before it lands on the same path)
        t0 = time.perf_counter()
        p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=5)
        took = time.perf_counter() - t0
    finally:
        p.kill()
    assert p.returncode == code and took < 5, (p.returncode, took, err)
    assert f"stopped by {sig}" in err


def test_the_memory_plan_refuses_before_the_calibration_is_packed(tmp_path, tiny_model, capsys, monkeypatch):
    """100,000 samples of 131,072 tokens were read and packed (21 s, 463 MB on a 74 MB file) before the memory plan
    refused them in milliseconds (a review): the plan now comes first."""

    def no_packing(*a, **k):
        raise AssertionError("the calibration was packed before the memory plan")

    monkeypatch.setattr(engine, "check_calibration", no_packing)
    cal = {"source": "builtin:jargon", "samples": 100_000, "seq_len": 131_072}
    recipe = write_recipe(tmp_path, tiny_model, "big", method="gptq", scheme="W4A16", group_size=64, calibration=cal)
    assert main(["run", str(recipe), "--quiet", "--max-memory", "1GiB"]) == 2
    assert "memory" in capsys.readouterr().err
