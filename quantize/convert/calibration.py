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
missing path, a folder that is not a saved dataset, a split, task or column that does not exist, conversations
that are not role/content lists (JSONL line by line; parquet and datasets by the column's type, so a null inside
a typed column is found only while packing), a chat source for a checkpoint without a chat template.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from quantize.convert.recipe import Calibration, MixtureSource
from quantize.errors import UsageError
from quantize.io import read_user_file, read_user_text, sha256_bytes, user_lines
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
    "builtin:jargon-heldout": (
        "jargon-heldout.jsonl",
        "Jargon File 4.4.7 glossary, held-out split (Debian jargon-text, public domain)",
    ),
}
MAX_FILE_BYTES = 1 << 30  # a .txt/.jsonl/.parquet source is read whole; a saved dataset is memory-mapped instead
TOO_BIG = "use a part of it, or save it with datasets' save_to_disk and give that folder (read memory-mapped)"
KINDS = "a .txt, .jsonl or .parquet file, a folder saved by datasets' save_to_disk, or builtin:jargon"
TEXT_TYPES = ("string", "large_string")


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
    if source.startswith("builtin:"):
        if source not in BUILTIN:
            raise UsageError(
                f"{where} = {source!r} is not a built-in source; use one of: {', '.join(BUILTIN)}, or {KINDS}"
            )
        name, desc = BUILTIN[source]
        return Path(str(resources.files("quantize") / "data" / name)), desc
    p = Path(source).expanduser()
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
    """Why a value is not a conversation (a non-empty list of {role, content} objects with string values), or None."""
    if not isinstance(value, list) or not value:
        return f"a {type(value).__name__}" if not isinstance(value, list) else "an empty list"
    for n, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"message {n} is {json.dumps(m, default=str)[:120]}"
    return None


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
    with user_lines(path, f"{where}: calibration source", MAX_FILE_BYTES, MAX_FILE_BYTES, hint=TOO_BIG) as lines:
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
            objects.append((n, obj))
    if not objects:
        raise UsageError(f"{where}: {path} holds no JSON lines; give a file with one object a line")
    kind, column = _column(list(objects[0][1]), given, where, f"{path} (keys of its first line)")
    values = []
    for n, obj in objects:
        if column not in obj:
            raise UsageError(f"{where}: {path}:{n} has no {column!r} key; add it, or remove that line")
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


def _parquet(path: Path, given: MixtureSource, where: str) -> tuple[str, str, list[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = read_user_file(path, where, MAX_FILE_BYTES, hint=TOO_BIG)
    try:
        table = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError) as e:
        raise UsageError(
            f"{where}: {path} is not a readable parquet file ({str(e)[:200]}); give a parquet file"
        ) from None
    kind, column = _check_arrow(table.schema, given, where, str(path))
    return kind, column, table.column(column).to_pylist()


def _saved_dataset(path: Path, given: MixtureSource, where: str) -> tuple[str, str, int, Callable[[int], Any]]:
    """A folder written by save_to_disk: a Dataset (state.json, dataset_info.json) or a DatasetDict
    (dataset_dict.json and a folder per split); loaded memory-mapped, offline."""
    fields = where.removesuffix(".source")
    is_dict = (path / "dataset_dict.json").is_file()
    if not is_dict and not ((path / "state.json").is_file() and (path / "dataset_info.json").is_file()):
        raise UsageError(
            f"{where} = {given.source!r} is a folder but not a dataset saved by datasets' save_to_disk (it has no "
            "state.json and dataset_info.json, nor dataset_dict.json); save the data with "
            "Dataset.save_to_disk(FOLDER), or give a .jsonl or .parquet file"
        )
    if not is_dict and given.split is not None:
        raise UsageError(f"{fields}.split = {given.split!r}: {path} holds one Dataset, not splits; remove split")
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise UsageError(
            f"{where}: {path} cannot be loaded as a saved dataset ({str(e)[:200]}); save it again"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        split = given.split or "train"
        if split not in ds:
            said = f"= {split!r}" if given.split else "is not given"
            raise UsageError(
                f"{fields}.split {said}: {path} has no {split!r} split; its splits are "
                f"{', '.join(map(repr, ds))}: name one with {fields}.split"
            )
        ds = ds[split]
    kind, column = _check_arrow(ds.data.schema, given, where, str(path))
    col = ds.select_columns([column])
    return kind, column, len(col), lambda i: col[i][column]


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
    """The items of one task of a golden-set version (verified against its manifest), as doc_to_text renders them."""
    import jinja2
    import yaml

    from quantize.golden.manifest import read_items, verify

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
        except jinja2.TemplateError as e:
            raise UsageError(
                f"{where}: item {n} of task {given.task} does not render through doc_to_text {template[:80]!r} "
                f"({str(e)[:160]}); use another task"
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
    if path.suffix == ".txt" and not given.source.startswith("builtin:"):
        if given.text_field or given.messages_field:
            raise UsageError(
                f"{where} = {given.source!r} is a .txt file, read whole as blank-line separated documents: it has "
                "no columns, so remove text_field/messages_field (or give a .jsonl or .parquet file)"
            )
        text = read_user_text(path, where, MAX_FILE_BYTES, hint=TOO_BIG)
        docs = [d for d in (d.strip() for d in text.split("\n\n")) if d]
        return Source(given, where, description, "text", None, len(docs), docs.__getitem__)
    if path.suffix == ".parquet":
        kind, column, values = _parquet(path, given, where)
    else:  # .jsonl, and the shipped text
        kind, column, values = _jsonl(path, given, where)
    values = [v for v in values if v]  # empty rows go before the shuffle, so the seed's order is over documents
    return Source(given, where, description, kind, column, len(values), values.__getitem__)


def read_documents(source: str) -> list[str]:
    """The documents of one text source (its rows, empty ones left out), as a calibration reads them."""
    src = open_source(MixtureSource(source=source, weight=1), "calibration.source")
    return [src.row(i) for i in range(src.rows)]


def chat_template_files(model_dir: Path) -> bool:
    """Whether a checkpoint folder carries a chat template (chat_template.jinja/.json, or tokenizer_config.json's
    `chat_template`), read before any model loads."""
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    cfg = model_dir / "tokenizer_config.json"
    if not cfg.is_file():
        return False
    try:
        data = json.loads(read_user_text(cfg, "tokenizer config", 64 << 20))
    except (json.JSONDecodeError, RecursionError):
        return False
    return isinstance(data, dict) and bool(data.get("chat_template"))


def _no_template(src: Source, model: str) -> UsageError:
    return UsageError(
        f"{src.where} = {src.given.source!r}: column {src.column!r} holds conversations, which are rendered through "
        f"the checkpoint's chat template, and {model} has none; give a checkpoint with a chat template, or read a "
        "text column with text_field"
    )


def golden_texts(folder: str, where: str) -> dict[str, list[str]]:
    """Every task's item prompts of a golden-set version, as the calibration reads a golden source."""
    from quantize.golden.manifest import verify

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


def check_calibration(cal: Calibration, model_dir: Path) -> None:
    """Everything about the calibration sources that can be checked before a model loads."""
    if cal.overlap_with is not None:
        golden_texts(cal.overlap_with, "calibration.overlap_with")
    for i, given in enumerate(cal.sources()):
        src = open_source(given, _where(cal, i))
        if src.rows == 0:
            raise UsageError(f"{src.where} = {given.source!r} holds no rows; give a source with text")
        if src.kind == "chat" and not chat_template_files(Path(model_dir)):
            raise _no_template(src, str(model_dir))


def shares(weights: list[float], samples: int) -> list[int]:
    """Rows per source: floor(share × samples), the rows left going to the largest remainders (ties: first)."""
    total = sum(weights)
    exact = [w / total * samples for w in weights]
    rows = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - rows[i]), i))
    for i in by_remainder[: samples - sum(rows)]:
        rows[i] += 1
    return rows


def _render(tokenizer: Any, src: Source, value: Any) -> tuple[list[int], int]:
    """A document's token ids, and how many of them the chat template added (rendered minus content tokens)."""
    if src.kind == "text":
        return tokenizer(value, add_special_tokens=False)["input_ids"], 0
    _check_value(value, "chat", src.column or "", src.where, "a row")  # a null inside a typed column
    messages = [{k: v for k, v in m.items() if v is not None} for m in value]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    content = sum(len(tokenizer(m["content"], add_special_tokens=False)["input_ids"]) for m in messages)
    return ids, len(ids) - content


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
        ids, template = _render(tokenizer, src, value)
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


def _template_sha256(tokenizer: Any, src: Source) -> str:
    try:
        template = tokenizer.get_chat_template()
    except ValueError:  # transformers: the tokenizer has no chat template
        raise _no_template(src, "the loaded tokenizer") from None
    return sha256_bytes(template.encode("utf-8"))


def build_calibration(tokenizer: Any, cal: Calibration) -> CalibrationSet:
    """Pack shuffled documents of each source into (samples, seq_len) token ids, and record what they were."""
    import numpy as np
    import torch

    given = cal.sources()
    sources = [open_source(g, _where(cal, i)) for i, g in enumerate(given)]
    rows = shares([g.weight for g in given], cal.samples)
    mixed = cal.mixture is not None
    packed, blocks, per_source, template_sha = [], [], [], None
    for i, (src, n) in enumerate(zip(sources, rows, strict=True)):
        if src.kind == "chat" and template_sha is None:
            template_sha = _template_sha256(tokenizer, src)
        # one source keeps the seed's own order (the token hashes of records before mixtures hold); each source of
        # a mixture gets an order of its own
        p = _pack(tokenizer, src, n * cal.seq_len, random.Random(f"{cal.seed}/{i}" if mixed else cal.seed))
        packed.append(p)
        blocks.append(np.asarray(p.stream[: n * cal.seq_len], dtype="<i8").reshape(n, cal.seq_len))
        per_source.append(
            CalibrationSourceRecord(
                source=src.given.source,
                description=src.description,
                kind=src.kind,
                field=src.column,
                weight=src.given.weight,
                samples=n,
                documents_used=len(p.lengths),
            )
        )
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
    return CalibrationSet(torch.from_numpy(np.ascontiguousarray(x)), record)
