"""Calibration data: local text, packed into fixed-length token sequences.

Sources never touch a hub: `builtin:jargon` is the Jargon File 4.4.7 glossary
(public domain) shipped in quantize/data (its calibration split; the held-out
split is kept for measuring perplexity), or a local file: .txt with documents
separated by blank lines, or .jsonl with a "text" field per line.

Documents are shuffled with the recipe's seed, tokenized, joined with EOS and
cut into `samples` rows of `seq_len` tokens: X is (samples, seq_len) int64.
The sha256 of X's bytes (int64, little-endian, row-major) identifies the data.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from quantize.convert.recipe import Calibration
from quantize.errors import UsageError
from quantize.io import read_user_text, sha256_bytes, user_lines
from quantize.records import CalibrationRecord

MAX_BYTES = 256 * 2**20  # a calibration file: a few hundred documents are kilobytes to megabytes
BUILTIN = {
    "builtin:jargon": (
        "jargon-calibration.jsonl",
        "Jargon File 4.4.7 glossary, calibration split (Debian jargon-text, public domain)",
    ),
    "builtin:jargon-heldout": (
        "jargon-heldout.jsonl",
        "Jargon File 4.4.7 glossary, held-out split (Debian jargon-text, public domain)",
    ),
}


@dataclass
class CalibrationSet:
    input_ids: Any  # torch.LongTensor (N, T) = (samples, seq_len)
    record: CalibrationRecord  # what quantize.json records: the token ids' sha256 stands for them


def source_path(source: str) -> tuple[Path, str]:
    """Resolve a calibration source to a file, or raise a UsageError that says what to do."""
    if source.startswith("builtin:"):
        if source not in BUILTIN:
            raise UsageError(
                f"calibration.source = {source!r} is not a built-in source; use one of: {', '.join(BUILTIN)}, or a "
                "local .txt/.jsonl path"
            )
        name, desc = BUILTIN[source]
        return Path(str(resources.files("quantize") / "data" / name)), desc
    p = Path(source).expanduser()
    if not p.is_file():
        raise UsageError(
            f"calibration.source = {source!r}: no such file; give a local .txt or .jsonl file, or builtin:jargon"
        )
    if p.suffix not in (".txt", ".jsonl"):
        raise UsageError(
            f"calibration.source = {source!r}: unsupported file type {p.suffix!r}; use .txt (blank-line separated "
            "documents) or .jsonl (a 'text' field per line)"
        )
    return p, f"local file {p}"


def read_documents(source: str) -> list[str]:
    """The source's documents, read the one safe way (quantize/io.py: a regular file of at most MAX_BYTES, strict
    UTF-8); a .jsonl file line by line."""
    path, _ = source_path(source)
    what, hint = "calibration source", "give a local .txt or .jsonl file"
    if path.suffix == ".jsonl":
        docs = []
        with user_lines(path, what, MAX_BYTES, MAX_BYTES, hint=hint) as lines:
            for n, raw in lines:
                line = lines.text(n, raw)
                if not line.strip():
                    continue
                try:
                    docs.append(json.loads(line)["text"])
                except (ValueError, RecursionError, KeyError, TypeError):
                    raise UsageError(f"{path}:{n} is not a JSON object with a 'text' field; fix that line") from None
    else:
        docs = [d.strip() for d in read_user_text(path, what, MAX_BYTES, hint=hint).split("\n\n")]
    docs = [d for d in docs if d]
    if not docs:
        raise UsageError(f"calibration source {path} holds no text")
    return docs


def build_calibration(tokenizer: Any, cal: Calibration) -> CalibrationSet:
    """Pack shuffled documents into (samples, seq_len) token ids."""
    import numpy as np
    import torch

    _, description = source_path(cal.source)
    docs = read_documents(cal.source)
    random.Random(cal.seed).shuffle(docs)
    need = cal.samples * cal.seq_len
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    used = 0
    for doc in docs:
        if len(stream) >= need:
            break
        stream.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        if eos is not None:
            stream.append(eos)
        used += 1
    if len(stream) < need:
        raise UsageError(
            f"calibration source {cal.source} holds {len(stream)} tokens, fewer than samples × seq_len = "
            f"{cal.samples} × {cal.seq_len} = {need}; lower calibration.samples or calibration.seq_len, or give more "
            "text"
        )
    x = np.asarray(stream[:need], dtype="<i8").reshape(cal.samples, cal.seq_len)  # (N, T)
    record = CalibrationRecord(
        source=cal.source,
        description=description,
        samples=cal.samples,
        seq_len=cal.seq_len,
        seed=cal.seed,
        documents_used=used,
        tokens=need,
        token_sha256=sha256_bytes(x.tobytes()),
    )
    return CalibrationSet(torch.from_numpy(x.copy()), record)
