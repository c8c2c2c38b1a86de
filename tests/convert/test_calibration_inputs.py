"""Calibration inputs a review of session 42 forged: Arrow files whose offsets point outside their data, compressed
and dictionary-encoded data that decodes to gigabytes from kilobytes, and the errors of templates and paths that
were exit 3. Each is exit 2 before any model loads, naming the field, the value and what to do."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from convert.test_calibration import FP8, no_model_load, refused
from convert.test_engine import write_recipe

from quantize.cli import main
from quantize.convert import calibration
from quantize.convert.calibration import read_documents

from conftest import ROOT

ARROW = "data-00000-of-00001.arrow"


def saved(folder: Path, texts: list[str]) -> Path:
    import datasets

    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(folder))
    return folder


def rewrite_arrow(folder: Path, batches: list, compression: str | None = None) -> None:
    """Replace a saved dataset's Arrow stream by one of these batches (each a pyarrow Array of its `text`)."""
    import pyarrow as pa

    schema = pa.schema([("text", pa.string())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for arr in batches:
            w.write_batch(pa.record_batch([arr], schema=schema))
    (folder / ARROW).write_bytes(sink.getvalue().to_pybytes())


def forged_strings(offsets: list[int], data: bytes):
    import pyarrow as pa

    n = len(offsets) - 1
    buffers = [None, pa.py_buffer(struct.pack(f"<{n + 1}i", *offsets)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), n, buffers)


RUN = "import sys; from quantize.cli import main; sys.exit(main(['run', sys.argv[1], '--quiet']))"


@pytest.mark.parametrize(
    "offsets,said",
    [
        ([0, 200_000_000, 200_000_005, 10], "offset for slot 1 out of bounds: 200000000 > 10"),  # was SIGSEGV
        ([0, 8, 3, 10], "non-monotonic offset at slot 2: 3 < 8"),  # was abort: std::length_error
    ],
)
def test_an_arrow_file_whose_offsets_leave_its_data_is_exit_2(tmp_path, tiny_model, offsets, said):
    """The file passed pyarrow's validate() (it checks the last offset, not each) and reading a row crashed the
    process before the load (exit 139 or 134): a subprocess, so the old crash fails this test, not the session."""
    import pyarrow as pa

    folder = saved(tmp_path / "ds", ["x"])
    rewrite_arrow(folder, [pa.array(["good text here " * 4] * 3), forged_strings(offsets, b"hello worl")])
    recipe = write_recipe(tmp_path, tiny_model, "oob", **FP8, calibration={"source": str(folder), "samples": 1})
    p = subprocess.run(
        [sys.executable, "-c", RUN, str(recipe)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert f"calibration.source: saved dataset file {folder / ARROW}: column 'text' of rows 3 to 5" in p.stderr
    assert said in p.stderr and "save_to_disk" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_a_compressed_ipc_body_is_recognised_as_pyarrow_writes_it(compression):
    """`_ipc_compressed` reads the flag from the message header pyarrow wrote: record batches and dictionaries."""
    import pyarrow as pa

    table = pa.table({"text": ["a", "b"] * 50, "label": pa.array(["x", "y"] * 50).dictionary_encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)
    kinds = []
    for message in pa.ipc.MessageReader.open_stream(sink.getvalue()):
        if message.type != "schema":
            kinds.append(message.type)
            assert calibration._ipc_compressed(message.metadata) == (compression is not None), message.type
    assert kinds == ["dictionary", "record batch"]


def test_a_compressed_saved_dataset_is_refused_before_it_is_decoded(tmp_path, tiny_model, capsys, monkeypatch):
    """98 KB of compressed stream decoded to 1.1 GB (more rows: out of memory) before the load: save_to_disk writes
    no compression, so a compressed batch is refused unread and the bytes decoded are the mapped file's own."""
    import pyarrow as pa

    no_model_load(monkeypatch)
    folder = saved(tmp_path / "ds", ["x"])
    rewrite_arrow(folder, [pa.array(["the hacker wrote a program " * 20] * 40)], compression="zstd")
    err = refused(tmp_path, tiny_model, capsys, {"source": str(folder)})
    assert f"saved dataset file {folder / ARROW} holds a compressed record batch" in err and "save_to_disk" in err


def test_a_parquet_column_is_decoded_within_the_bound(tmp_path, tiny_model, capsys, monkeypatch):
    """564 bytes of parquet (one dictionary value repeated) decoded to 1 GB, 2.8 GB as Python strings, before the
    load: the decoded bytes of the column are counted and bounded (here the bound made 1 MiB), and a footer that
    says the column is larger is refused before decoding."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    no_model_load(monkeypatch)
    monkeypatch.setattr(calibration, "MAX_FILE_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": ["word " * 13_000] * 200, "n": range(200)}), str(bomb), compression="zstd")
    assert bomb.stat().st_size < 10_000  # 13 MB of text: the dictionary holds it once
    err = refused(tmp_path, tiny_model, capsys, {"source": str(bomb)})
    assert f"calibration.source: {bomb}, column 'text' decodes to more than 1,048,576 bytes" in err, err
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"text": [f"{i} " * 20_000 for i in range(30)]}), str(plain), use_dictionary=False)
    err = refused(tmp_path, tiny_model, capsys, {"source": str(plain)})
    assert f"calibration.source: {plain}, column 'text' decodes to more than 1,048,576 bytes" in err, err


def test_a_parquet_sources_documents_are_its_non_empty_rows_in_order(tmp_path):
    """Read a batch at a time and left as Arrow values until read: the documents are the rows that are not null or
    empty, in the file's order, across batches (as the whole column read as Python gave them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [
        None if i % 7 == 0 else "" if i % 5 == 0 else f"row {i}" for i in range(calibration.PARQUET_BATCH_ROWS * 3)
    ]
    pq.write_table(pa.table({"text": texts}), str(tmp_path / "t.parquet"), row_group_size=100)
    assert read_documents(str(tmp_path / "t.parquet")) == [t for t in texts if t]


def golden_with(tmp_path: Path, doc_to_text: str) -> Path:
    """golden/std/v1 with arc_easy's doc_to_text replaced, its manifest's hash of the task YAML made to match."""
    import shutil

    import yaml

    from quantize.io import sha256_bytes

    folder = tmp_path / "gold"
    shutil.copytree(ROOT / "golden" / "std" / "v1", folder)
    task = folder / "tasks" / "arc_easy.yaml"
    cfg = yaml.safe_load(task.read_text())
    task.write_text(yaml.safe_dump({**cfg, "doc_to_text": doc_to_text}))
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    manifest["files"]["tasks/arc_easy.yaml"]["sha256"] = sha256_bytes(task.read_bytes())
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))
    return folder


def test_a_doc_to_text_that_raises_a_python_error_is_exit_2(tmp_path, tiny_model, capsys, monkeypatch):
    """Only Jinja's own errors were caught: `question + 1` (a TypeError) was exit 3, as a source and as overlap_with."""
    no_model_load(monkeypatch)
    gold = golden_with(tmp_path, "{{ question + 1 }}")
    for fields, where in (
        ({"source": str(gold), "task": "arc_easy"}, "calibration.source"),
        ({"overlap_with": str(gold)}, "calibration.overlap_with"),
    ):
        err = refused(tmp_path, tiny_model, capsys, fields)
        assert f"{where}: item 0 of task arc_easy of {gold} does not render through doc_to_text" in err, err
        assert "TypeError: can only concatenate str" in err and "fix the task's doc_to_text" in err


def test_a_chat_template_that_runs_out_of_memory_is_exit_2(tmp_path, tiny_model, capsys, monkeypatch):
    """`'x' * 2**40` raises MemoryError, which was not caught: exit 3."""
    from convert.test_calibration import chat_checkpoint

    no_model_load(monkeypatch)
    model = chat_checkpoint(tmp_path, tiny_model, "{{ 'x' * 2**40 }}")
    err = refused(tmp_path, model, capsys, {"source": "builtin:jargon-chat"})
    assert "calibration.source = 'builtin:jargon-chat': the checkpoint's chat template does not render row" in err
    assert "MemoryError; fix the template" in err


NO_USER = "~quantize-no-such-user-s42"


def test_a_home_folder_of_no_user_is_exit_2_naming_the_field(tmp_path, tiny_model, capsys, monkeypatch):
    """Path.expanduser raises RuntimeError for ~USER of no user: exit 3, for a source and for the model."""
    from quantize.checkpoint.loader import resolve_model
    from quantize.convert.gguf import source_gguf
    from quantize.errors import UsageError

    no_model_load(monkeypatch)
    err = refused(tmp_path, tiny_model, capsys, {"source": f"{NO_USER}/x.jsonl"})
    assert f"calibration.source = '{NO_USER}/x.jsonl': {NO_USER} names no home folder" in err, err
    recipe = write_recipe(tmp_path, Path(f"{NO_USER}/m"), "nouser", **FP8)
    assert main(["run", str(recipe), "--quiet"]) == 2
    assert f"model = '{NO_USER}/m': {NO_USER} names no home folder" in capsys.readouterr().err
    for resolve in (resolve_model, source_gguf):
        with pytest.raises(UsageError, match=f"model = '{NO_USER}/m.gguf'"):
            resolve(f"{NO_USER}/m.gguf")


def test_split_on_a_file_or_builtin_source_is_exit_2(tmp_path, tiny_model, capsys, monkeypatch):
    """`split` was accepted, did nothing and was recorded; only a DatasetDict folder has splits."""
    no_model_load(monkeypatch)
    (tmp_path / "t.jsonl").write_text('{"text": "the hacker wrote a program"}\n')
    for source, what in (("builtin:jargon", "a built-in source"), (str(tmp_path / "t.jsonl"), "a file")):
        err = refused(tmp_path, tiny_model, capsys, {"source": source, "split": "test"})
        assert f"calibration.split = 'test': '{source}' is {what}, which has no splits; remove split" in err, err
    mix = [{"source": "builtin:jargon", "weight": 1}, {"source": "builtin:jargon", "weight": 1, "split": "x"}]
    err = refused(tmp_path, tiny_model, capsys, {"mixture": mix})
    assert "calibration.mixture.1.split = 'x': 'builtin:jargon' is a built-in source" in err, err


def test_a_mixture_source_that_gets_no_rows_is_exit_2(tmp_path, tiny_model, capsys, monkeypatch):
    """A source whose share rounds to 0 rows was read and recorded (a chat template's sha and a 0.0% line) and
    changed nothing; 1,500 entries for 1 row took 202 s and 3.3 GB before the load: refused before any is read."""
    no_model_load(monkeypatch)
    mix = [{"source": "builtin:jargon", "weight": 1}, {"source": "builtin:jargon-chat", "weight": 0.1}]
    err = refused(tmp_path, tiny_model, capsys, {"mixture": mix, "samples": 4})
    assert "calibration.mixture.1.weight = 0.1 gives 'builtin:jargon-chat' 0 of the calibration.samples = 4" in err
    opened = []
    monkeypatch.setattr(calibration, "open_source", lambda *a: opened.append(a) or pytest.fail("a source was read"))
    many = [{"source": "builtin:jargon", "weight": 1} for _ in range(1500)]
    recipe = write_recipe(tmp_path, tiny_model, "many", **FP8, calibration={"mixture": many, "samples": 1})
    assert main(["run", str(recipe), "--quiet"]) == 2  # not `refused`: PyYAML takes 2 s to read 1,500 entries
    err = capsys.readouterr().err
    assert "calibration.mixture: 1,500 sources for calibration.samples = 1 rows" in err, err
    assert "give samples of at least 1,500, or fewer sources" in err and not opened


def test_a_source_a_mixture_names_twice_is_opened_once(tmp_path, tiny_model, monkeypatch):
    """Each entry was opened and held on its own; the same path and fields now share one opening (the packing,
    each entry's own seeded order and rows, is unchanged)."""
    from transformers import AutoTokenizer

    from quantize.convert.calibration import check_calibration, pack_calibration
    from quantize.convert.recipe import Calibration

    opened = []
    real = calibration.open_source
    monkeypatch.setattr(calibration, "open_source", lambda given, where: opened.append(where) or real(given, where))
    (tmp_path / "t.jsonl").write_text('{"text": "the hacker wrote a program for the system and the user ran it"}\n' * 3)
    mix = [{"source": "builtin:jargon", "weight": 1}] * 3 + [{"source": str(tmp_path / "t.jsonl"), "weight": 1}]
    cal = Calibration(mixture=mix, samples=4, seq_len=16)
    check_calibration(Calibration(mixture=mix[:3], samples=4, seq_len=16), tiny_model)
    assert opened == ["calibration.mixture.0.source"]
    opened.clear()
    x, record = pack_calibration(AutoTokenizer.from_pretrained(str(tiny_model)), cal)
    assert opened == ["calibration.mixture.0.source", "calibration.mixture.3.source"]
    assert [s.samples for s in record.sources] == [1, 1, 1, 1] and x.shape == (4, 16)
    assert len({tuple(row) for row in x.tolist()}) == 4  # each entry packed in an order of its own


def test_a_fifo_source_is_not_told_to_use_a_part_of_it(tmp_path, tiny_model, capsys, monkeypatch):
    """The size hint ("use a part of it, or save it with save_to_disk") ended every refusal of a file source, a FIFO's
    too; it ends only the refusal of a file too large now."""
    no_model_load(monkeypatch)
    for name in ("pipe.txt", "pipe.parquet", "pipe.jsonl"):
        os.mkfifo(tmp_path / name)
        err = refused(tmp_path, tiny_model, capsys, {"source": str(tmp_path / name)})
        assert f"{tmp_path / name} is not a regular file (a pipe, a device or a socket); give a file" in err, err
        assert "use a part of it" not in err
    monkeypatch.setattr(calibration, "MAX_FILE_BYTES", 16)
    (tmp_path / "big.txt").write_text("the hacker wrote a program\n")
    err = refused(tmp_path, tiny_model, capsys, {"source": str(tmp_path / "big.txt")})
    assert "big.txt is 27 bytes; at most 16 are read here; use a part of it, or save it" in err, err


def test_an_empty_jsonl_row_is_skipped_as_a_tables_is(tmp_path):
    """{"messages": []} was refused in JSONL while parquet and saved datasets skip an empty row; null, "" and [] are
    now skipped in every kind of table (a row of the wrong type is still refused)."""
    from quantize.convert.calibration import open_source
    from quantize.convert.recipe import MixtureSource
    from quantize.errors import UsageError

    chat = [{"role": "user", "content": "the hacker"}]
    rows = [{"messages": chat}, {"messages": []}, {"messages": None}, {"messages": chat}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    src = open_source(MixtureSource(source=str(tmp_path / "c.jsonl"), weight=1), "calibration.source")
    assert src.kind == "chat" and [src.row(i) for i in range(src.rows)] == [chat, chat]
    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n{"text": ""}\n{"text": null}\n{"text": "b"}\n')
    assert read_documents(str(tmp_path / "t.jsonl")) == ["a", "b"]
    (tmp_path / "n.jsonl").write_text('{"text": "a"}\n{"text": 0}\n')
    with pytest.raises(UsageError, match="n.jsonl:2, column 'text' holds a int, not text"):
        read_documents(str(tmp_path / "n.jsonl"))
