"""Calibration data: local sources, read as text or as conversations, packed into fixed-length token sequences.

Sources never touch a hub. A source is recognised from what its path holds:

    builtin:jargon      the Jargon File 4.4.7 glossary (public domain) shipped in quantize/data (its calibration
                        split; the held-out split is kept for measuring perplexity)
    builtin:jargon-chat the same calibration split as 300 conversations (`messages`; quantize/data/README.md)
    FILE.txt            documents separated by blank lines
    FILE.jsonl          one JSON object a line
    FILE.parquet        a table (read with pyarrow)
    FOLDER              a dataset saved by `datasets`' save_to_disk (a Dataset, or a DatasetDict and its `split`)
    golden/SET/VERSION  a golden-set version (MANIFEST.json, verified): the items of its `task`, each as the task
                        YAML's doc_to_text renders it (a field name, or a Jinja template rendered sandboxed)

A table (JSONL, parquet, dataset) is read from one column: `messages_field` (conversations: lists of {role,
content}), else `text_field`, else its `messages` column if it has one, else its `text` column. Conversations
are rendered through the checkpoint's own chat template (the tokenizer's `apply_chat_template`), so an instruct
model is calibrated on text shaped as it sees it in use; the template's sha256 is recorded.

Documents are shuffled with the recipe's seed, tokenized, joined with EOS and cut into `samples` rows of
`seq_len` tokens: X is (samples, seq_len) int64. A mixture packs floor(weight share × samples) rows from each
source (the rows left go to the largest remainders), then shuffles the rows with the seed. The sha256 of X's
bytes (int64, little-endian, row-major) identifies the data. `check_calibration` checks before a model loads: a
missing path (or ~USER of no user), a folder that is not a saved dataset, a split, task or column that does not
exist, a split on a file, a mixture source that gets no rows (before any source is read; one named twice is read
once), a golden task's doc_to_text that raises, conversations
that are not role/content lists or hold no content (JSONL line by line, parquet row by row; a saved dataset by its
column's type), a chat source for a checkpoint without a chat template, mixture weights whose sum is not finite;
then, with the checkpoint's tokenizer read from its files (`FileTokenizer`: no model, no torch), it packs every
source as the run will: each conversation the calibration reads rendered through the chat template (one that does
not parse or raises is refused), a null inside a saved dataset's conversation, a source too small for its share.

A saved dataset's files are read the one safe way (quantize/io.py) before any library sees them: dataset_dict.json,
state.json and dataset_info.json as regular files of at most 16 MiB, strictly UTF-8 JSON of the shapes save_to_disk
writes (each field that is not is named); every split folder and data file they name must lie inside the folder once
links are followed; each data-*.arrow file is opened non-blocking, checked to be a regular file of at most 64 GiB
with fstat on that descriptor, and memory-mapped from it (a FIFO there had hung `quantize run`); its record batches
are views of the mapping (a compressed one, which save_to_disk never writes, is refused unread: pyarrow would
decompress it whole), and a batch is checked in full (offsets inside their data, UTF-8) when a row of it is first
read. A parquet file's one column is decoded a batch at a time, at most MAX_FILE_BYTES decoded.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import statistics
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from quantize.convert.recipe import Calibration, MixtureSource
from quantize.errors import UsageError
from quantize.golden.manifest import read_items, verify
from quantize.io import expand_user, open_user_file, read_user_file, read_user_text, sha256_bytes, user_lines
from quantize.records import CalibrationRecord, CalibrationSourceRecord, TokenSpread, VocabularyOverlap

BUILTIN = {
    "builtin:jargon": (
        "jargon-calibration.jsonl",
        "Jargon File 4.4.7 glossary, calibration split (Debian jargon-text, public domain)",
    ),
    "builtin:jargon-chat": (
        "jargon-chat.jsonl",
        "Jargon File 4.4.7 calibration split as 300 conversations (tools/make_chat_calibration.py, public domain)",
    ),
}
# the Jargon File's held-out split (quantize/data/jargon-heldout.jsonl): the documents of golden/core's cloze and
# prose items and of the benchmarks' held-out perplexity, for measuring only (the benchmarks read the file itself)
HELD_OUT = "builtin:jargon-heldout"
HELD_OUT_FILE = "jargon-heldout.jsonl"
MAX_FILE_BYTES = 1 << 30  # a .txt/.jsonl/.parquet source is read whole; a saved dataset is memory-mapped instead
PARQUET_BATCH_ROWS = 256  # a parquet column is decoded this many rows at a time, its decoded bytes counted
TOO_BIG = "use a part of it, or save it with datasets' save_to_disk and give that folder (read memory-mapped)"
KINDS = "a .txt, .jsonl or .parquet file, a folder saved by datasets' save_to_disk, or builtin:jargon"
TEXT_TYPES = ("string", "large_string")
DATASET_JSON_BYTES = 16 << 20  # dataset_dict.json, state.json, dataset_info.json: save_to_disk writes a few KB
ARROW_BYTES = 64 << 30  # one data-*.arrow file, memory-mapped (save_to_disk writes 500 MB shards)
MAX_DATA_FILES = 100_000  # state.json's _data_files
TOKENIZER_BYTES = 64 << 20  # tokenizer.json, tokenizer_config.json, special_tokens_map.json, as other checkpoint JSON
TEMPLATE_BYTES = 16 << 20  # a chat template (.jinja); the shipped checkpoints' are a few KB
SAVE_AGAIN = "save the data again with Dataset.save_to_disk(FOLDER) (or DatasetDict.save_to_disk)"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass
class CalibrationSet:
    input_ids: Any  # torch.LongTensor (N, T) = (samples, seq_len)
    record: CalibrationRecord  # what quantize.json records: the token ids' sha256 stands for them


@dataclass
class Source:
    """One source, opened and checked: `row(i)` is its i-th value (a text, or a list of messages; None or ''
    for an empty row, skipped)."""

    given: MixtureSource
    where: str  # the recipe field, for messages: calibration.source, calibration.mixture.1.source
    description: str
    kind: Literal["text", "chat"]
    column: str | None
    rows: int
    row: Callable[[int], Any]


@dataclass
class Packed:
    """What one source gave: its token stream and what its documents were like."""

    stream: list[int]
    lengths: list[int] = field(default_factory=list)  # rendered tokens per document used
    template_tokens: int = 0


def _where(cal: Calibration, i: int) -> str:
    return "calibration.source" if cal.mixture is None else f"calibration.mixture.{i}.source"


def source_path(source: str, where: str = "calibration.source") -> tuple[Path, str]:
    """Resolve a calibration source to a file or folder, or raise a UsageError that says what to do."""
    if source == HELD_OUT:
        raise UsageError(
            f"{where} = {source!r} is the held-out split, for measuring only: golden/core's cloze and prose items "
            "are its documents, and a model calibrated on them is judged on what it was fitted to (an optimistic "
            "verdict). Use builtin:jargon (the calibration split) or builtin:jargon-chat"
        )
    if source.startswith("builtin:"):
        if source not in BUILTIN:
            raise UsageError(
                f"{where} = {source!r} is not a built-in source; use one of: {', '.join(BUILTIN)}, or {KINDS}"
            )
        name, desc = BUILTIN[source]
        return Path(str(resources.files("quantize") / "data" / name)), desc
    p = expand_user(source, where)
    if p.is_dir() and (p / "MANIFEST.json").is_file():
        return p, f"golden set {p}"
    if p.is_dir():
        return p, f"saved dataset {p}"
    if not p.exists():
        raise UsageError(f"{where} = {source!r}: no such file or folder; give {KINDS}")
    if p.suffix not in (".txt", ".jsonl", ".parquet"):
        raise UsageError(f"{where} = {source!r}: unsupported file type {p.suffix!r}; give {KINDS}")
    return p, f"local file {p}"


def _column(columns: list[str], given: MixtureSource, where: str, what: str) -> tuple[Literal["text", "chat"], str]:
    """Which column to read, and as what: the field the recipe names (it must exist), else messages, else text."""
    fields = where.removesuffix(".source")
    for name, kind in ((given.messages_field, "chat"), (given.text_field, "text")):
        if name is not None:
            if name not in columns:
                key = "messages_field" if kind == "chat" else "text_field"
                raise UsageError(
                    f"{fields}.{key} = {name!r}: {what} has no such column; its columns are "
                    f"{', '.join(map(repr, columns)) or '(none)'}: name one of them"
                )
            return kind, name
    if "messages" in columns:
        return "chat", "messages"
    if "text" in columns:
        return "text", "text"
    raise UsageError(
        f"{where} = {given.source!r}: {what} has no 'messages' or 'text' column (its columns: "
        f"{', '.join(map(repr, columns)) or '(none)'}); name the column to read with {fields}.text_field (raw text) "
        f"or {fields}.messages_field (conversations: lists of {{role, content}})"
    )


def _bad_messages(value: Any) -> str | None:
    """Why a value is not a conversation (a non-empty list of {role, content} objects with string values, some
    content not blank), or None."""
    if not isinstance(value, list) or not value:
        return f"a {type(value).__name__}" if not isinstance(value, list) else "an empty list"
    for n, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"message {n} is {json.dumps(m, default=str)[:120]}"
    if not any(m["content"].strip() for m in value):
        return "every message's content is empty: the template's own tokens alone are no calibration data"
    return None


def _empty(value: Any) -> bool:
    """An empty row, skipped in every kind of table: null, '' or [] (a 0 or false is a value, of the wrong type)."""
    return value is None or (isinstance(value, str | list) and not value)


def _check_value(value: Any, kind: str, column: str, where: str, origin: str) -> None:
    if kind == "chat":
        if (why := _bad_messages(value)) is not None:
            raise UsageError(
                f"{where}: {origin}, column {column!r} is not a conversation ({why}); each row must hold a list of "
                "{role, content} objects with string values: fix the data, or read a text column with text_field"
            )
    elif value is not None and not isinstance(value, str):
        raise UsageError(
            f"{where}: {origin}, column {column!r} holds a {type(value).__name__}, not text; name a text column with "
            "text_field, or a conversation column with messages_field"
        )


def _jsonl(path: Path, given: MixtureSource, where: str) -> tuple[str, str, list[Any]]:
    objects = []
    with user_lines(path, f"{where}: calibration source", MAX_FILE_BYTES, MAX_FILE_BYTES, too_big=TOO_BIG) as lines:
        for n, raw in lines:  # strict UTF-8 line by line (quantize/io.py)
            line = lines.text(n, raw)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                obj = None
            if not isinstance(obj, dict):
                raise UsageError(f"{where}: {path}:{n} is not a JSON object; fix that line")
            try:  # a \ud800 escape decodes to a lone surrogate, which no tokenizer takes (exit 3, in a review)
                json.dumps(obj, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                raise UsageError(
                    f"{where}: {path}:{n} holds a lone surrogate escape (\\ud800-\\udfff), which is no text; fix "
                    "that line"
                ) from None
            objects.append((n, obj))
    if not objects:
        raise UsageError(f"{where}: {path} holds no JSON lines; give a file with one object a line")
    kind, column = _column(list(objects[0][1]), given, where, f"{path} (keys of its first line)")
    values = []
    for n, obj in objects:
        if column not in obj:
            raise UsageError(f"{where}: {path}:{n} has no {column!r} key; add it, or remove that line")
        if not _empty(obj[column]):  # skipped, as a table's empty rows are
            _check_value(obj[column], kind, column, where, f"{path}:{n}")
        values.append(obj[column])
    return kind, column, values


def _arrow_type_ok(kind: str, t: Any) -> bool:
    """A text column is strings; a conversation column a list of structs with string role and content."""
    import pyarrow as pa

    if kind == "text":
        return str(t) in TEXT_TYPES
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        return False
    names = {t.value_type.field(i).name: str(t.value_type.field(i).type) for i in range(t.value_type.num_fields)}
    return names.get("role") in TEXT_TYPES and names.get("content") in TEXT_TYPES


def _check_arrow(schema: Any, given: MixtureSource, where: str, what: str) -> tuple[Literal["text", "chat"], str]:
    kind, column = _column(list(schema.names), given, where, what)
    t = schema.field(column).type
    if not _arrow_type_ok(kind, t):
        want = "strings" if kind == "text" else "lists of {role: string, content: string}"
        raise UsageError(
            f"{where}: {what}, column {column!r} is of type {t}, not {want}; "
            + (
                "name a text column with text_field, or a conversation column with messages_field"
                if kind == "text"
                else "each row must hold a list of {role, content} objects: fix the data, or read a text column "
                "with text_field"
            )
        )
    return kind, column


def _parquet(path: Path, given: MixtureSource, where: str) -> tuple[str, str, int, Callable[[int], Any]]:
    """A parquet file's one column, decoded a batch at a time within MAX_FILE_BYTES (the footer's sizes checked
    first): a 564-byte file whose 800 rows repeat one dictionary value decoded to 1 GB, 2.8 GB of memory as Python
    strings (a review). Rows stay Arrow values until the packing reads them; empty ones (null, '', []) are left out."""
    import bisect

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    raw = read_user_file(path, where, MAX_FILE_BYTES, too_big=TOO_BIG)
    unreadable = (pa.ArrowException, OSError)

    def refuse(e: BaseException) -> UsageError:
        return UsageError(f"{where}: {path} is not a readable parquet file ({str(e)[:200]}); give a parquet file")

    try:
        pf = pq.ParquetFile(pa.BufferReader(raw))  # not read_table: pyarrow.dataset imports pandas, 0.5 s
        schema, meta = pf.schema_arrow, pf.metadata
    except unreadable as e:
        raise refuse(e) from None
    kind, column = _check_arrow(schema, given, where, str(path))
    too_big = (
        f"{where}: {path}, column {column!r} decodes to more than {MAX_FILE_BYTES:,} bytes, the bound on a file "
        f"source (the file is {len(raw):,} bytes); {TOO_BIG}"
    )
    leaves = [j for j in range(meta.num_columns) if meta.schema.column(j).path.split(".")[0] == column]
    groups = range(meta.num_row_groups)
    claimed = sum(meta.row_group(r).column(j).total_uncompressed_size for r in groups for j in leaves)
    if claimed > MAX_FILE_BYTES:
        raise UsageError(too_big)
    chunks, keep, starts, decoded = [], [], [0], 0
    try:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[column], use_threads=False):
            arr = batch.column(0)
            if (decoded := decoded + arr.nbytes) > MAX_FILE_BYTES:
                raise UsageError(too_big)
            arr.validate(full=True)  # strings UTF-8: to_pylist raised UnicodeDecodeError, exit 3 (a review)
            length = pc.binary_length(arr) if kind == "text" else pc.list_value_length(arr)
            mask = pc.fill_null(pc.greater(length, 0), False).to_numpy(zero_copy_only=False)
            keep.append(np.flatnonzero(mask) + starts[-1])
            chunks.append(arr)
            starts.append(starts[-1] + len(arr))
    except unreadable as e:
        raise refuse(e) from None
    rows = np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64)

    def value(i: int) -> Any:
        k = bisect.bisect_right(starts, i) - 1
        return chunks[k][i - starts[k]].as_py()

    if kind == "chat":  # a null inside a typed conversation (a message, a role, a content), one row at a time
        for i in rows:
            _check_value(value(int(i)), kind, column, where, f"{path}, row {i}")
    return kind, column, len(rows), lambda n: value(int(rows[n]))


def _brief(value: Any) -> str:
    """A JSON value for a message: a container by its kind, a scalar as JSON, bounded."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list" if value else "[]"
    return json.dumps(value)[:80]


def _relative(name: str) -> bool:
    """Whether a name from a saved dataset's own files is a relative path without `..` (a file system can name it)."""
    try:
        name.encode("utf-8")  # a lone surrogate names no file
    except UnicodeEncodeError:
        return False
    bad = not name or "\x00" in name or "\\" in name or name.startswith("/")
    return not bad and ".." not in PurePosixPath(name).parts


def _inside(folder: Path, name: str, where: str, field: str) -> Path:
    """`folder / name`, where `name` (from a saved dataset's own files) must be a relative path that stays inside
    `folder` once links are followed; else a UsageError naming `field`."""
    if not _relative(name):
        raise UsageError(
            f"{where}: {field} = {json.dumps(name)[:200]} is not a path inside the dataset folder {folder}; "
            f"{SAVE_AGAIN}"
        )
    path = folder / name
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a loop of links
        inside = False
    if not inside:
        raise UsageError(
            f"{where}: {path} ({field}) leads outside the dataset folder {folder} through a link; put the file "
            f"itself there, or {SAVE_AGAIN}"
        )
    return path


def _dataset_json(folder: Path, name: str, where: str) -> Any:
    """One of datasets' own JSON files in a saved dataset folder, read the one safe way and parsed."""
    path = _inside(folder, name, where, "datasets' own file")
    text = read_user_text(path, f"{where}: saved dataset file", DATASET_JSON_BYTES, hint=SAVE_AGAIN)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{where}: saved dataset file {path} is not JSON ({str(e)[:120]}); {SAVE_AGAIN}") from None


def _data_files(folder: Path, where: str) -> list[Path]:
    """The data files of a saved Dataset: state.json's `_data_files`, each a file inside the folder (dataset_info.json
    checked as the object datasets reads)."""
    info = _dataset_json(folder, "dataset_info.json", where)
    if not isinstance(info, dict) or not isinstance(info.get("features"), dict | None):
        field = "(top level)" if not isinstance(info, dict) else "features"
        shown = _brief(info if not isinstance(info, dict) else info["features"])
        raise UsageError(
            f"{where}: saved dataset file {folder / 'dataset_info.json'}: {field} = {shown} is not an object; "
            f"{SAVE_AGAIN}"
        )
    state = _dataset_json(folder, "state.json", where)
    files = state.get("_data_files") if isinstance(state, dict) else None
    origin = f"{where}: saved dataset file {folder / 'state.json'}"
    if not isinstance(state, dict) or not isinstance(files, list) or not 0 < len(files) <= MAX_DATA_FILES:
        field, shown = ("(top level)", _brief(state)) if not isinstance(state, dict) else ("_data_files", _brief(files))
        raise UsageError(
            f"{origin}: {field} = {shown}; save_to_disk writes an object whose _data_files lists 1 to "
            f'{MAX_DATA_FILES:,} {{"filename": NAME}} objects; {SAVE_AGAIN}'
        )
    paths = []
    for n, entry in enumerate(files):
        if not isinstance(entry, dict):
            raise UsageError(f'{origin}: _data_files[{n}] = {_brief(entry)} is not {{"filename": NAME}}; {SAVE_AGAIN}')
        if not isinstance(name := entry.get("filename"), str):
            raise UsageError(f"{origin}: _data_files[{n}].filename = {_brief(name)} is not a file name; {SAVE_AGAIN}")
        paths.append(_inside(folder, name, where, f"{folder / 'state.json'} _data_files[{n}].filename"))
    return paths


def _split_folder(path: Path, given: MixtureSource, where: str) -> Path:
    """The folder of the split a DatasetDict's dataset_dict.json lists (`split`, else train), inside `path`."""
    fields = where.removesuffix(".source")
    meta = _dataset_json(path, "dataset_dict.json", where)
    splits = meta.get("splits") if isinstance(meta, dict) else None
    origin = f"{where}: saved dataset file {path / 'dataset_dict.json'}"
    if not isinstance(splits, list) or not splits:
        field, shown = ("(top level)", _brief(meta)) if not isinstance(meta, dict) else ("splits", _brief(splits))
        raise UsageError(
            f"{origin}: {field} = {shown}; save_to_disk writes an object whose splits lists the split names (each a "
            f"folder beside it); {SAVE_AGAIN}"
        )
    for n, name in enumerate(splits):
        if not isinstance(name, str) or not _relative(name):
            raise UsageError(
                f"{origin}: splits[{n}] = {_brief(name)} is not the name of a folder inside {path}; {SAVE_AGAIN}"
            )
    split = given.split or "train"
    if split not in splits:
        said = f"= {split!r}" if given.split else "is not given"
        raise UsageError(
            f"{fields}.split {said}: {path} has no {split!r} split; its splits are "
            f"{', '.join(map(repr, splits[:20]))}: name one with {fields}.split"
        )
    folder = _inside(path, split, where, f"{path / 'dataset_dict.json'} splits")
    if not folder.is_dir():
        raise UsageError(
            f"{where}: {path / 'dataset_dict.json'} lists the split {split!r}, but {folder} is not a folder; "
            f"{SAVE_AGAIN}"
        )
    return folder


def _ipc_compressed(metadata: Any) -> bool:
    """Whether an IPC message's header (a RecordBatch, or a DictionaryBatch's) declares its body compressed. pyarrow
    decompresses such a body whole into memory when it reads the batch and offers no way to ask before; the header
    is a flatbuffer (Arrow's format/Message.fbs: Message field 2 is the header, RecordBatch field 3 `compression`,
    DictionaryBatch field 1 its RecordBatch), which pyarrow has verified when it read the message."""
    import struct

    buf = memoryview(metadata).cast("B")

    def table(at: int) -> int:  # the table an offset at `at` points to
        return at + struct.unpack_from("<I", buf, at)[0]

    def field(t: int, n: int) -> int:  # position of field n of the table at t, or 0 where absent
        vtable = t - struct.unpack_from("<i", buf, t)[0]
        size = struct.unpack_from("<H", buf, vtable)[0]
        off = struct.unpack_from("<H", buf, vtable + 4 + 2 * n)[0] if 4 + 2 * n < size else 0
        return t + off if off else 0

    message = table(0)
    kind, header = field(message, 1), field(message, 2)
    if not kind or not header:
        return False
    batch = table(header)
    if buf[kind] == 2:  # a DictionaryBatch: its RecordBatch `data`
        if not (data := field(batch, 1)):
            return False
        batch = table(data)
    return field(batch, 3) != 0


def _arrow_batches(path: Path, where: str) -> tuple[Any, list[Any]]:
    """A data-*.arrow file (an Arrow IPC stream, as save_to_disk writes it) as its schema and record batches,
    memory-mapped from the descriptor the safe open checked (a regular file within ARROW_BYTES): no library opens
    the path itself. Each batch is a zero-copy view of the mapping: a compressed body (which save_to_disk never
    writes, and which pyarrow would decompress whole into memory: a 98 KB file took 1.1 GB) is refused before it is
    read, so the bytes decoded are the file's own. Each batch's layout is checked (buffer sizes); its offsets and
    text only when a row of it is read (`_saved_dataset`)."""
    import mmap

    import pyarrow as pa

    with open_user_file(path, f"{where}: saved dataset file", ARROW_BYTES, hint=SAVE_AGAIN) as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise UsageError(f"{where}: saved dataset file {path} is empty; {SAVE_AGAIN}")
        try:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise UsageError(f"{where}: saved dataset file {path} cannot be mapped ({e.strerror})") from None
    batches = []
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(mapped))
        schema = pa.ipc.read_schema(reader.read_next_message())
        for message in reader:
            if message.type != "record batch" or _ipc_compressed(message.metadata):
                what = "a compressed record batch" if message.type == "record batch" else f"a {message.type} message"
                break
            batch = pa.ipc.read_record_batch(message, schema)
            batch.validate()
            batches.append(batch)
        else:
            what = None
    except (pa.ArrowException, OSError, ValueError, IndexError, StopIteration, struct.error) as e:
        raise UsageError(
            f"{where}: saved dataset file {path} is not an Arrow stream as save_to_disk writes ({str(e)[:160]}); "
            f"{SAVE_AGAIN}"
        ) from None
    if what is not None:
        raise UsageError(
            f"{where}: saved dataset file {path} holds {what}, which save_to_disk does not write (its record batches "
            f"are read memory-mapped, uncompressed: the bytes decoded are the file's own); {SAVE_AGAIN}"
        )
    return schema, batches


def _saved_dataset(path: Path, given: MixtureSource, where: str) -> tuple[str, str, int, Callable[[int], Any]]:
    """A folder written by save_to_disk: a Dataset (state.json, dataset_info.json, data files) or a DatasetDict
    (dataset_dict.json and a folder per split), each file checked, then its data files memory-mapped (pyarrow)."""
    import bisect

    fields = where.removesuffix(".source")
    one = any(os.path.lexists(path / name) for name in ("state.json", "dataset_info.json"))
    if not one and not os.path.lexists(path / "dataset_dict.json"):
        raise UsageError(
            f"{where} = {given.source!r} is a folder but not a dataset saved by datasets' save_to_disk (it has no "
            "state.json and dataset_info.json, nor dataset_dict.json); save the data with "
            "Dataset.save_to_disk(FOLDER), or give a .jsonl or .parquet file"
        )
    if one and given.split is not None:
        raise UsageError(f"{fields}.split = {given.split!r}: {path} holds one Dataset, not splits; remove split")
    files = _data_files(path if one else _split_folder(path, given, where), where)
    read = [_arrow_batches(f, where) for f in files]
    schema = read[0][0]
    for f, (s, _) in zip(files[1:], read[1:], strict=True):
        if not s.equals(schema):
            raise UsageError(
                f"{where}: saved dataset file {f} holds other columns than {files[0].name} "
                f"({s.to_string(show_schema_metadata=False)[:200]}); {SAVE_AGAIN}"
            )
    kind, column = _check_arrow(schema, given, where, str(path))
    index = schema.get_field_index(column)
    chunks = [(f, b.column(index)) for f, (_, batches) in zip(files, read, strict=True) for b in batches]
    starts = [0]
    for _, c in chunks:
        starts.append(starts[-1] + len(c))
    checked: set[int] = set()

    def row(i: int) -> Any:
        """Row i as Python. Its record batch is checked whole first, offsets and UTF-8 (`validate(full=True)`): its
        layout alone was checked when the file was read, and offsets out of their data crashed the process (SIGSEGV,
        a review's forged file) while text that does not decode was exit 3; each batch once, only those read."""
        import pyarrow as pa

        k = bisect.bisect_right(starts, i) - 1
        f, chunk = chunks[k]
        if k not in checked:
            try:
                chunk.validate(full=True)
            except pa.ArrowException as e:
                raise UsageError(
                    f"{where}: saved dataset file {f}: column {column!r} of rows {starts[k]} to {starts[k + 1] - 1} "
                    f"(one record batch; Arrow counts its slots from row {starts[k]}) is not valid Arrow data "
                    f"({str(e)[:160]}); {SAVE_AGAIN}"
                ) from None
            checked.add(k)
        return chunk[i - starts[k]].as_py()

    return kind, column, starts[-1], row


def _template_errors() -> tuple[type[BaseException], ...]:
    """What a template raises on data it does not take: its own errors (a syntax error, `raise_exception`), a Python
    error inside it (`question + 1`), or memory it cannot have (`'x' * 2**40`); a recursion is said apart."""
    import jinja2

    return (jinja2.TemplateError, TypeError, ValueError, LookupError, ArithmeticError, AttributeError, MemoryError)


def _error(e: BaseException) -> str:
    """An exception for a message: its type, and its text where it has one (a MemoryError has none)."""
    return f"{type(e).__name__}: {str(e)[:200]}" if str(e) else type(e).__name__


def _doc_to_text(template: Any, doc: dict[str, Any]) -> str:
    """lm-eval's doc_to_text of one item: the value of the field it names, else the Jinja template rendered
    (sandboxed, undefined names an error)."""
    if isinstance(template, str) and template in doc:
        return str(doc[template])
    from jinja2 import StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
    return env.from_string(template).render(**doc)


def _golden(path: Path, given: MixtureSource, where: str) -> tuple[int, Callable[[int], Any], str]:
    """The items of one task of a golden-set version (verified against its manifest), as doc_to_text renders them;
    a doc_to_text that does not parse or raises on an item (a Jinja or Python error) is refused naming the item."""
    import yaml

    fields = where.removesuffix(".source")
    if given.text_field or given.messages_field or given.split:
        raise UsageError(
            f"{where} = {given.source!r} is a golden set, read through its task YAML's doc_to_text: remove "
            "text_field, messages_field and split, and name the task with task"
        )
    golden = verify(path)
    if given.task not in golden.tasks:
        said = "is not given" if given.task is None else f"= {given.task!r} is not a task of {path}"
        raise UsageError(f"{fields}.task {said}; name one of its tasks: {', '.join(golden.tasks)}")
    cfg_path = path / "tasks" / f"{given.task}.yaml"
    try:
        template = (yaml.safe_load(read_user_text(cfg_path, "task YAML", 1 << 20)) or {}).get("doc_to_text")
    except yaml.YAMLError as e:  # a `!function` doc_to_text (Python) is not read here
        raise UsageError(
            f"{where}: {cfg_path} cannot be read as plain YAML ({str(e)[:160]}); a task whose doc_to_text is Python "
            "code cannot be a calibration source"
        ) from None
    if not isinstance(template, str):
        raise UsageError(f"{where}: {cfg_path} has no doc_to_text string; use another task")
    items = read_items(golden, given.task)
    texts = []
    for n, doc in enumerate(items):
        try:
            texts.append(_doc_to_text(template, doc))
        except (*_template_errors(), RecursionError) as e:
            raise UsageError(
                f"{where}: item {n} of task {given.task} of {path} does not render through doc_to_text "
                f"{template[:80]!r} ({_error(e)}); fix the task's doc_to_text, or use another task"
            ) from None
    texts = [t for t in texts if t]
    return len(texts), texts.__getitem__, f"golden set {path}, task {given.task} (doc_to_text)"


def open_source(given: MixtureSource, where: str) -> Source:
    """Open one source and check it whole (JSONL rows one by one; parquet and datasets by their column types)."""
    path, description = source_path(given.source, where)
    if given.task is not None and not (path / "MANIFEST.json").is_file():
        raise UsageError(
            f"{where.removesuffix('.source')}.task = {given.task!r}: {given.source!r} is not a golden-set version "
            "(no MANIFEST.json); remove task, or give a folder such as golden/std/v1"
        )
    if path.is_dir() and (path / "MANIFEST.json").is_file():
        rows, row, description = _golden(path, given, where)
        return Source(given, where, description, "text", None, rows, row)
    if path.is_dir():
        kind, column, rows, row = _saved_dataset(path, given, where)
        return Source(given, where, description, kind, column, rows, row)
    if given.split is not None:  # a setting that changes nothing is refused, not recorded
        raise UsageError(
            f"{where.removesuffix('.source')}.split = {given.split!r}: {given.source!r} is "
            f"{'a built-in source' if given.source.startswith('builtin:') else 'a file'}, which has no splits; remove "
            "split (it names a split of a DatasetDict folder saved by save_to_disk)"
        )
    if path.suffix == ".txt" and not given.source.startswith("builtin:"):
        if given.text_field or given.messages_field:
            raise UsageError(
                f"{where} = {given.source!r} is a .txt file, read whole as blank-line separated documents: it has "
                "no columns, so remove text_field/messages_field (or give a .jsonl or .parquet file)"
            )
        text = read_user_text(path, where, MAX_FILE_BYTES, too_big=TOO_BIG)
        docs = [d for d in (d.strip() for d in text.split("\n\n")) if d]
        return Source(given, where, description, "text", None, len(docs), docs.__getitem__)
    if path.suffix == ".parquet":
        kind, column, rows, row = _parquet(path, given, where)
        return Source(given, where, description, kind, column, rows, row)
    kind, column, values = _jsonl(path, given, where)  # .jsonl, and the shipped text
    values = [v for v in values if not _empty(v)]  # empty rows go before the shuffle: the seed orders documents
    return Source(given, where, description, kind, column, len(values), values.__getitem__)


def read_documents(source: str) -> list[str]:
    """The documents of one text source (its rows, empty ones left out), as a calibration reads them."""
    src = open_source(MixtureSource(source=source, weight=1), "calibration.source")
    return [src.row(i) for i in range(src.rows)]


def _tokenizer_json(model_dir: Path, name: str) -> dict[str, Any]:
    """A tokenizer JSON file of the checkpoint (tokenizer_config.json, special_tokens_map.json), read the one safe way,
    as an object; {} where it is absent, not JSON or not an object (the tokenizer's load then says what it says)."""
    path = model_dir / name
    if not os.path.lexists(path):
        return {}
    try:
        data = json.loads(read_user_text(path, "tokenizer file", TOKENIZER_BYTES))
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def chat_template(model_dir: Path) -> str | dict[str, str] | None:
    """The checkpoint's chat template as transformers' tokenizer reads it, from the files alone: chat_template.jinja
    and additional_chat_templates/*.jinja (more than the first: a mapping by name, chat_template.jinja's `default`),
    else tokenizer_config.json's `chat_template` (a string, or a list of {name, template}); None where there is none."""
    found = {}
    if os.path.lexists(model_dir / "chat_template.jinja"):
        found["default"] = read_user_text(model_dir / "chat_template.jinja", "chat template", TEMPLATE_BYTES)
    if (model_dir / "additional_chat_templates").is_dir():
        for f in sorted((model_dir / "additional_chat_templates").glob("*.jinja")):
            found[f.name.removesuffix(".jinja")] = read_user_text(f, "chat template", TEMPLATE_BYTES)
    if found:
        return found["default"] if list(found) == ["default"] else found
    value = _tokenizer_json(model_dir, "tokenizer_config.json").get("chat_template")
    if isinstance(value, list):
        named = [t for t in value if isinstance(t, dict) and isinstance(t.get("name"), str)]
        return {t["name"]: t["template"] for t in named if isinstance(t.get("template"), str)} or None
    return value if isinstance(value, str) and value else None


def _template_environment() -> Any:
    """The Jinja environment transformers renders chat templates in (transformers 5,
    utils/chat_template_utils._compile_jinja_template), built from jinja2 alone (importing transformers takes a
    second or more): sandboxed, trim_blocks and lstrip_blocks, loop controls, its `{% generation %}` tag (the body
    rendered), `tojson` without HTML escaping, `raise_exception` and `strftime_now`."""
    import datetime

    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


@dataclass
class FileTokenizer:
    """The checkpoint's tokenizer from its files alone, for packing before a model loads (transformers' tokenizer
    classes import torch, seconds): tokenizer.json through the `tokenizers` library, which transformers' fast
    tokenizers run, and the chat template rendered as transformers renders it (`_template_environment`) with the
    named special tokens the tokenizer files give. It offers what packing calls: `__call__`, `eos_token_id`,
    `get_chat_template`, `apply_chat_template` (tests/convert/test_calibration.py holds it to AutoTokenizer's ids
    and renderings)."""

    encoder: Any  # tokenizers.Tokenizer
    special: dict[str, str]  # bos_token, eos_token, ... as the template sees them
    template: str | dict[str, str] | None

    @property
    def eos_token_id(self) -> int | None:
        """The EOS token's id; an EOS the vocabulary lacks is the unknown token's, as in transformers."""
        if (eos := self.special.get("eos_token")) is None:
            return None
        found = self.encoder.token_to_id(eos)
        unk = self.special.get("unk_token")
        return found if found is not None or unk is None else self.encoder.token_to_id(unk)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.encoder.encode(text, add_special_tokens=add_special_tokens).ids}

    def get_chat_template(self) -> str:
        """The template used without tools (a mapping's `default`); ValueError where there is none, as transformers."""
        template = self.template.get("default") if isinstance(self.template, dict) else self.template
        if template is None:
            raise ValueError("no chat template (several named ones, none `default`)")
        return template

    @functools.cached_property
    def _compiled(self) -> Any:
        return _template_environment().from_string(self.get_chat_template())

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False) -> str:
        """The conversation as text, as transformers' apply_chat_template(messages, tokenize=False) renders it."""
        assert not tokenize, "packing renders text, then tokenizes it"
        return self._compiled.render(
            messages=messages, tools=None, documents=None, add_generation_prompt=False, **self.special
        )


def _special_tokens(model_dir: Path) -> dict[str, str]:
    """The named special tokens as transformers gives them to a template: tokenizer_config.json's, with
    special_tokens_map.json over them where the config has no `added_tokens_decoder` (its legacy path)."""
    config = _tokenizer_json(model_dir, "tokenizer_config.json")
    legacy = {} if "added_tokens_decoder" in config else _tokenizer_json(model_dir, "special_tokens_map.json")
    values = config | legacy
    out = {}
    for key in SPECIAL_TOKENS:
        value = values.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[key] = value
    return out


def file_tokenizer(model_dir: Path) -> FileTokenizer | None:
    """The checkpoint's tokenizer from its files (FileTokenizer), or None where they do not say what transformers
    loads: no tokenizer.json (a slow tokenizer), a tokenizer of the checkpoint's own code (`auto_map`), other fast
    files named, or a tokenizer.json the tokenizers library cannot read (the load after then decides)."""
    config = _tokenizer_json(model_dir, "tokenizer_config.json")
    path = model_dir / "tokenizer.json"
    if not os.path.lexists(path) or "auto_map" in config or "fast_tokenizer_files" in config:
        return None
    import tokenizers

    text = read_user_text(path, "tokenizer file", TOKENIZER_BYTES)
    try:
        encoder = tokenizers.Tokenizer.from_str(text)
    except Exception:  # the tokenizers library raises a bare Exception for a file it cannot read
        return None
    return FileTokenizer(encoder, _special_tokens(model_dir), chat_template(model_dir))


def _no_template(src: Source, model: str) -> UsageError:
    return UsageError(
        f"{src.where} = {src.given.source!r}: column {src.column!r} holds conversations, which are rendered through "
        f"the checkpoint's chat template, and {model} has none; give a checkpoint with a chat template, or read a "
        "text column with text_field"
    )


def golden_texts(folder: str, where: str) -> dict[str, list[str]]:
    """Every task's item prompts of a golden-set version, as the calibration reads a golden source."""
    path, _ = source_path(folder, where)
    if not (path / "MANIFEST.json").is_file():
        raise UsageError(
            f"{where} = {folder!r} is not a golden-set version (no MANIFEST.json); give e.g. golden/core/v2"
        )
    out = {}
    for task in verify(path).tasks:
        rows, row, _ = _golden(path, MixtureSource(source=folder, weight=1, task=task), where)
        out[task] = [row(i) for i in range(rows)]
    return out


def vocabulary_overlap(tokenizer: Any, folder: str, x: Any) -> VocabularyOverlap:
    """The share of a golden set's distinct token ids, and of its token occurrences, found among the ids X."""
    import numpy as np

    texts = golden_texts(folder, "calibration.overlap_with")
    ids = np.asarray(
        [i for t in texts.values() for s in t for i in tokenizer(s, add_special_tokens=False)["input_ids"]]
    )
    seen = np.isin(ids, np.unique(x))
    distinct = np.unique(ids)
    return VocabularyOverlap(
        golden=folder,
        tasks=sorted(texts),
        distinct_tokens=len(distinct),
        distinct_share=float(np.isin(distinct, np.unique(x)).mean()) if len(distinct) else 0.0,
        token_share=float(seen.mean()) if len(ids) else 0.0,
    )


def check_calibration(cal: Calibration, model_dir: Path, tokenizer: FileTokenizer | None = None) -> None:
    """Everything about the calibration that can be checked before a model loads: the weights, each source read and
    checked whole, a chat template for conversations, and, with the tokenizer from the checkpoint's files
    (`file_tokenizer`), the packing itself as `build_calibration` will do it after the load: every conversation it
    reads rendered through the template, each source's share of the tokens filled. `tokenizer`, where given, is
    the one the run packs with in place of the files' (a GGUF's own, backends/llamacpp.gguf_tokenizer)."""
    _check_weights(cal)
    if cal.overlap_with is not None:
        golden_texts(cal.overlap_with, "calibration.overlap_with")
    model_dir = Path(model_dir)
    sources = []
    for src in _open_sources(cal):
        given = src.given
        if src.rows == 0:
            raise UsageError(f"{src.where} = {given.source!r} holds no rows; give a source with text")
        if src.kind == "chat" and (chat_template(model_dir) if tokenizer is None else tokenizer.template) is None:
            raise _no_template(src, str(model_dir))
        sources.append(src)
    if (tokenizer := tokenizer or file_tokenizer(model_dir)) is not None:
        _pack_sources(tokenizer, cal, sources, str(model_dir))


def _open_sources(cal: Calibration) -> list[Source]:
    """Each source of the calibration opened (`open_source`), a source a mixture names more than once (the same path
    and fields) opened once and shared: 1,500 entries of one source were 1,500 copies of it (3.3 GB, 202 s)."""
    opened: dict[tuple[Any, ...], Source] = {}
    out = []
    for i, given in enumerate(cal.sources()):
        key = (given.source, given.text_field, given.messages_field, given.split, given.task)
        if key not in opened:
            opened[key] = open_source(given, _where(cal, i))
        out.append(dataclasses.replace(opened[key], given=given, where=_where(cal, i)))
    return out


def _check_weights(cal: Calibration) -> None:
    """A mixture's weights are shares of their sum: each finite and above 0 (the schema's rule, for a Calibration
    built without it), and the sum finite too (1e308 + 1e308 is infinity, and every share would be NaN); and each
    source gets a row of the samples (one that gets none is read, recorded and changes nothing), checked before any
    source is opened."""
    weights = [s.weight for s in cal.sources()]
    for i, w in enumerate(weights):
        if not (math.isfinite(w) and w > 0):
            raise UsageError(f"calibration.mixture.{i}.weight = {w}: give a finite number above 0 (e.g. 0.7 and 0.3)")
    if not math.isfinite(sum(weights)):
        raise UsageError(
            f"calibration.mixture: the weights ({', '.join(f'{w:g}' for w in weights[:8])}) sum to "
            f"{sum(weights)}; a weight is a share relative to the others, so scale them down (e.g. 0.7 and 0.3)"
        )
    if cal.mixture is not None and 0 in (rows := shares(weights, cal.samples)):
        i = rows.index(0)
        if len(weights) > cal.samples:
            raise UsageError(
                f"calibration.mixture: {len(weights):,} sources for calibration.samples = {cal.samples} rows, and each "
                f"source needs a row of its own (calibration.mixture.{i}, {cal.mixture[i].source!r}, would get none "
                f"and change nothing); give samples of at least {len(weights):,}, or fewer sources"
            )
        raise UsageError(
            f"calibration.mixture.{i}.weight = {weights[i]:g} gives {cal.mixture[i].source!r} 0 of the "
            f"calibration.samples = {cal.samples} rows (each source's share of the rows, rounded down, the rows left "
            "going to the largest remainders), so it would be read and recorded and change nothing; raise "
            "calibration.samples or its weight, or remove it from the mixture"
        )


def shares(weights: list[float], samples: int) -> list[int]:
    """Rows per source: floor(share × samples), the rows left going to the largest remainders (ties: first)."""
    total = sum(weights)
    exact = [w / total * samples for w in weights]
    rows = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - rows[i]), i))
    for i in by_remainder[: samples - sum(rows)]:
        rows[i] += 1
    return rows


def _render(tokenizer: Any, src: Source, value: Any, i: int) -> tuple[list[int], int]:
    """Document i's token ids, and how many of them the chat template added (rendered minus content tokens)."""
    if src.kind == "text":
        return tokenizer(value, add_special_tokens=False)["input_ids"], 0
    _check_value(value, "chat", src.column or "", src.where, f"row {i}")  # a null inside a typed column
    messages = [{k: v for k, v in m.items() if v is not None} for m in value]
    text = _chat_text(tokenizer, src, messages, i)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    content = sum(len(tokenizer(m["content"], add_special_tokens=False)["input_ids"]) for m in messages)
    return ids, len(ids) - content


def _chat_text(tokenizer: Any, src: Source, messages: list[dict[str, str]], i: int) -> str:
    """A conversation rendered through the chat template; a template that does not parse, or raises on it (its
    `raise_exception`, a Python error inside, memory it cannot have), is the checkpoint's to fix: a UsageError naming
    the row."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    except RecursionError:
        raise UsageError(
            f"{src.where} = {src.given.source!r}: the checkpoint's chat template recurses without end on row {i} of "
            f"column {src.column!r}; fix the template"
        ) from None
    except _template_errors() as e:
        raise UsageError(
            f"{src.where} = {src.given.source!r}: the checkpoint's chat template does not render row {i} of column "
            f"{src.column!r} (starting {json.dumps(messages[0])[:80]}): {_error(e)}; fix the "
            "template (chat_template.jinja, or tokenizer_config.json's chat_template), or read a text column with "
            "text_field"
        ) from None


def _pack(tokenizer: Any, src: Source, need: int, rng: random.Random) -> Packed:
    """Tokens of the source's documents in a seeded order, joined with EOS, until `need` are there."""
    order = list(range(src.rows))
    rng.shuffle(order)
    eos = tokenizer.eos_token_id
    out = Packed([])
    for i in order:
        if len(out.stream) >= need:
            break
        value = src.row(i)
        if value is None or value == "":
            continue
        ids, template = _render(tokenizer, src, value, i)
        out.stream.extend(ids)
        if eos is not None:
            out.stream.append(eos)
        out.lengths.append(len(ids))
        out.template_tokens += template
    if len(out.stream) < need:
        raise UsageError(
            f"{src.where} = {src.given.source!r} holds {len(out.stream)} tokens, fewer than samples × seq_len = "
            f"{need} ({'its share of ' if src.where != 'calibration.source' else ''}the rows × tokens per row); lower "
            "calibration.samples or calibration.seq_len, or give more text"
        )
    return out


def _template_sha256(tokenizer: Any, src: Source, model: str) -> str:
    try:
        template = tokenizer.get_chat_template()
    except ValueError:  # transformers: the tokenizer has no chat template
        raise _no_template(src, model) from None
    return sha256_bytes(template.encode("utf-8"))


def _pack_sources(
    tokenizer: Any, cal: Calibration, sources: list[Source], model: str
) -> tuple[list[int], list[Packed], str | None]:
    """Each source's rows (`shares`) packed in its seeded order, and the chat template's sha256 where a source is
    conversations: what build_calibration records, and what check_calibration runs before a model loads."""
    _check_weights(cal)
    rows = shares([s.given.weight for s in sources], cal.samples)
    mixed = cal.mixture is not None
    packed, template_sha = [], None
    for i, (src, n) in enumerate(zip(sources, rows, strict=True)):
        if src.kind == "chat" and template_sha is None:
            template_sha = _template_sha256(tokenizer, src, model)
        # one source keeps the seed's own order (the token hashes of records before mixtures hold); each source of
        # a mixture gets an order of its own
        packed.append(_pack(tokenizer, src, n * cal.seq_len, random.Random(f"{cal.seed}/{i}" if mixed else cal.seed)))
    return rows, packed, template_sha


def build_calibration(tokenizer: Any, cal: Calibration) -> CalibrationSet:
    """Pack shuffled documents of each source into (samples, seq_len) token ids, and record what they were: the
    rows of `pack_calibration` as a torch tensor."""
    import torch

    x, record = pack_calibration(tokenizer, cal)
    return CalibrationSet(torch.from_numpy(x), record)


def pack_calibration(tokenizer: Any, cal: Calibration) -> tuple[Any, CalibrationRecord]:
    """The calibration rows, (samples, seq_len) int64 in a C-contiguous numpy array, and their record; no torch
    (a GGUF recipe's importance matrix is computed in llama.cpp from these rows)."""
    import numpy as np

    _check_weights(cal)
    sources = _open_sources(cal)
    rows, packed, template_sha = _pack_sources(tokenizer, cal, sources, "the loaded tokenizer")
    mixed = cal.mixture is not None
    blocks = [
        np.asarray(p.stream[: n * cal.seq_len], dtype="<i8").reshape(n, cal.seq_len)
        for p, n in zip(packed, rows, strict=True)
    ]
    per_source = [
        CalibrationSourceRecord(
            source=src.given.source,
            description=src.description,
            kind=src.kind,
            field=src.column,
            weight=src.given.weight,
            samples=n,
            documents_used=len(p.lengths),
        )
        for src, n, p in zip(sources, rows, packed, strict=True)
    ]
    x = np.concatenate(blocks)  # (N, T)
    if mixed:
        order = list(range(cal.samples))
        random.Random(cal.seed).shuffle(order)
        x = x[order]
    lengths = [n for p in packed for n in p.lengths]
    total = sum(lengths)
    template = sum(p.template_tokens for p in packed) if template_sha else None
    record = CalibrationRecord(
        source="mixture" if mixed else sources[0].given.source,
        description="mixture of " + ", ".join(f"{s.description} (weight {s.given.weight:g})" for s in sources)
        if mixed
        else sources[0].description,
        samples=cal.samples,
        seq_len=cal.seq_len,
        seed=cal.seed,
        documents_used=len(lengths),
        tokens=cal.samples * cal.seq_len,
        token_sha256=sha256_bytes(np.ascontiguousarray(x).tobytes()),
        sources=per_source,
        document_tokens=TokenSpread(
            min=min(lengths), median=float(statistics.median(lengths)), max=max(lengths), total=total
        ),
        chat_template_sha256=template_sha,
        chat_template_tokens=template,
        chat_template_share=template / total if template is not None and total else None,
        overlap=vocabulary_overlap(tokenizer, cal.overlap_with, x) if cal.overlap_with else None,
    )
    return np.ascontiguousarray(x), record
