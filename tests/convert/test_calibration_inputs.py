"""Calibration inputs a review of session 42 forged: Arrow files whose offsets point outside their data, compressed
and dictionary-encoded data that decodes to gigabytes from kilobytes, and the errors of templates and paths that
were exit 3. Each is exit 2 before any model loads, naming the field, the value and what to do."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from convert.test_calibration import FP8, no_model_load, refused
from convert.test_engine import write_recipe

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
