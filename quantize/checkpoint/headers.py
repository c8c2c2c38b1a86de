"""Safetensors headers, read and checked: the format's rules, nothing of a model.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (name -> dtype, shape,
data_offsets), then the tensor bytes. `read_header` parses one file's header and enforces the format's rules;
`all_tensors` joins a checkpoint's shards, and `check_shard_index` holds a shard index's weight_map to them. No
tensor data is read but by `small_ints` (a few bytes of a small integer tensor: compressed-tensors' weight_shape),
and nothing here imports torch: the accounting
(bits per weight), the memory plan, the loader's checks and config.json's check against the weights
(files.config_matches_headers) all read headers through this module.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantize.errors import UsageError

MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
# safetensors' sizes are Rust's 64-bit usize: it refuses a shape whose running product of dimensions, or that
# product times the dtype's bits, passes this (tests/checkpoint/test_accounting.py holds the rule to the library's)
USIZE_MAX = 2**64 - 1
MAX_DIM = 2**63 - 1  # torch's sizes are signed 64-bit: a larger dimension is no tensor it can make

# Bits per element of every dtype safetensors defines.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

# The torch dtype (its attribute name) safetensors reads each of these stored dtypes as, for the ones the project
# builds meta tensors from (another is read as bytes of its shape; tests/checkpoint/test_accounting.py holds each
# to what safetensors writes for it), and the floating ones of 16 bits and up, those a model is built in
# (transformers' get_state_dict_dtype passes over float8 and float4).
TORCH_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
FLOATS = {k: TORCH_NAMES[k] for k in ("F64", "F32", "F16", "BF16")}


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    file: str
    offset: int = 0  # where its bytes begin in the file (8 + header length + its first data offset)


# little-endian, as safetensors stores every dtype: the integer dtypes small_ints reads
INT_FORMATS = {"I8": "b", "U8": "B", "I16": "h", "U16": "H", "I32": "i", "U32": "I", "I64": "q", "U64": "Q"}


def small_ints(files: dict[str, Path], tensors: list[TensorInfo]) -> dict[str, list[int]]:
    """The values of small integer tensors (each's dtype one of INT_FORMATS, at most 64 bytes), by name: each file
    opened once and read where the header puts the tensor, in file order. A tensor of another kind is left out."""
    out: dict[str, list[int]] = {}
    wanted = [t for t in tensors if t.dtype in INT_FORMATS and t.nbytes <= 64]
    for file in sorted({t.file for t in wanted}):
        with files[file].open("rb") as f:
            for t in sorted((t for t in wanted if t.file == file), key=lambda t: t.offset):
                f.seek(t.offset)
                if len(raw := f.read(t.nbytes)) == t.nbytes:  # a file cut short since its header was read: left out
                    out[t.name] = list(struct.unpack(f"<{math.prod(t.shape)}{INT_FORMATS[t.dtype]}", raw))
    return out


# --- the header parser ------------------------------------------------------------------------


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Parse and check one safetensors header. Returns tensors, __metadata__, bytes read.

    Enforces safetensors' rules: header length within the file and at most 100 MB,
    a JSON object, known dtypes, non-negative integer shapes, offsets in bounds,
    contiguous and non-overlapping, byte size = prod(shape) × dtype size.
    """
    size = path.stat().st_size
    bad = _Invalid(path)
    raw = _header_bytes(path, size, bad)
    header, meta = _header_json(raw, bad)
    data_size = size - 8 - len(raw)
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        info, begin, end = _tensor_entry(name, entry, data_size, path.name, bad)
        info.offset = 8 + len(raw) + begin
        tensors[name] = info
        spans.append((begin, end, name))
    _check_contiguous(spans, data_size, bad)
    return tensors, meta, 8 + len(raw)


class _Invalid:
    """The one message of a bad header: the file, what is wrong, what to do."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, why: str) -> UsageError:
        return UsageError(f"{self.path} is not a valid safetensors file: {why}. Re-save or re-download the checkpoint.")


def _header_bytes(path: Path, size: int, bad: _Invalid) -> bytes:
    """The header: an 8-byte little-endian length n, then n bytes, within the file and at most 100 MB."""
    if size < 8:
        raise bad(f"it is {size} bytes long, shorter than the 8-byte header length")
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise bad(f"header length {n} exceeds the 100 MB limit")
        if n > size - 8:
            raise bad(f"header length {n} runs past the end of the {size}-byte file")
        return f.read(n)


def _header_json(raw: bytes, bad: _Invalid) -> tuple[dict[str, Any], dict[str, str]]:
    """The header's JSON object without __metadata__, and __metadata__ (strings to strings, the format's rule)."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: bad JSON, or an over-long integer
        raise bad(f"header is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    meta = header.pop("__metadata__", None)  # absent or null: no metadata; [], "", 0 or false are not "none"
    if meta is None:
        meta = {}
    string_values = "__metadata__ must be an object of string values"
    if not isinstance(meta, dict):
        raise bad(f"__metadata__ is a JSON {_json_type(meta)} ({json.dumps(meta)[:40]}); {string_values}")
    for k, v in meta.items():
        if not isinstance(v, str):
            raise bad(f"__metadata__[{k!r}] is a JSON {_json_type(v)}; {string_values}")
    return header, meta


def _json_type(x: Any) -> str:
    """The JSON name of a parsed value's type (a bool is a JSON boolean, not an int)."""
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if x is None else names.get(type(x), type(x).__name__)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _tensor_entry(name: str, entry: Any, data_size: int, file: str, bad: _Invalid) -> tuple[TensorInfo, int, int]:
    """One tensor's entry checked: exactly dtype, shape, data_offsets; a known dtype; a shape of non-negative
    integers; offsets [begin, end] inside the data section spanning prod(shape) × dtype bits / 8 bytes."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"tensor name {name.encode('utf-8', 'backslashreplace')!r} is not valid Unicode") from None
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad(f"entry {name!r} must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise bad(f"tensor {name!r} has shape {shape!r}; a shape is a list of non-negative integers")
    if not _sized(shape, DTYPE_BITS[dtype]):
        raise bad(
            f"tensor {name!r} has shape {str(shape)[:120]}, past the 64-bit sizes the safetensors library computes "
            f"with (each dimension below 2**63, their running product and its {DTYPE_BITS[dtype]} bits an element "
            "below 2**64)"
        )
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets):
        raise bad(f"tensor {name!r} has data_offsets {offsets!r}; expected [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise bad(f"tensor {name!r} has data_offsets {offsets} outside the {data_size}-byte data section")
    nbits = math.prod(shape) * DTYPE_BITS[dtype]
    if nbits % 8 or nbits // 8 != end - begin:
        raise bad(f"tensor {name!r}: {dtype} {shape} needs {nbits / 8:g} bytes, its offsets span {end - begin}")
    return TensorInfo(name, dtype, shape, end - begin, file), begin, end


def _sized(shape: list[int], bits: int) -> bool:
    """Whether the library can size the tensor: each running product of its dimensions, from the first, and the
    last times `bits` within USIZE_MAX (it multiplies checked and refuses an overflow), no dimension past MAX_DIM."""
    n = 1
    for d in shape:
        n *= d
        if d > MAX_DIM or n > USIZE_MAX:
            return False
    return n * bits <= USIZE_MAX


def _check_contiguous(spans: list[tuple[int, int, str]], data_size: int, bad: _Invalid) -> None:
    """The tensors tile the data section exactly: no gap, no overlap, nothing after the last."""
    cursor = 0
    for begin, end, name in sorted(spans):
        if begin != cursor:
            why = (
                "overlaps the previous tensor"
                if begin < cursor
                else f"leaves a gap of {begin - cursor} bytes before it"
            )
            raise bad(f"tensor {name!r} at {begin} {why}")
        cursor = end
    if cursor != data_size:
        raise bad(f"tensors end at byte {cursor} of a {data_size}-byte data section")


def check_shard_index(index: Path, weight_map: dict[str, str], tensors: dict[str, TensorInfo]) -> None:
    """A shard index's weight_map (tensor name -> shard file name) against the shards' headers (`tensors`, every
    shard the index names): every tensor it names is in the shard it names, and every tensor a shard holds is named
    there. An index that names a tensor no shard holds stopped model_free_ptq with an UnboundLocalError (a loader
    that reads whole shards skips the name), and one that leaves a stored tensor out made model_free_ptq drop it;
    either is refused here, naming the tensor, the index and the shard."""
    fix = "re-save the checkpoint (save_pretrained writes the index with its shards), or correct the index"
    for name, shard in sorted(weight_map.items()):
        if (t := tensors.get(name)) is None:
            raise UsageError(f"{index} names tensor {name!r} in {shard}, but no shard holds it; {fix}")
        if t.file != shard:
            raise UsageError(f"{index} names tensor {name!r} in {shard}, but {t.file} holds it; {fix}")
    if unnamed := sorted(set(tensors) - set(weight_map)):
        t = tensors[unnamed[0]]
        raise UsageError(
            f"{t.file} holds tensor {t.name!r}, which {index} does not name ({len(unnamed)} such tensor(s)); {fix}"
        )


def all_tensors(files: list[Path]) -> tuple[dict[str, TensorInfo], int]:
    """Every shard's tensors (a name in two shards is refused) and the header bytes read."""
    tensors: dict[str, TensorInfo] = {}
    header_read = 0
    for f in files:
        found, _, nread = read_header(f)
        header_read += nread
        if dup := set(found) & set(tensors):
            raise UsageError(f"tensor {sorted(dup)[0]!r} appears in two shards; the checkpoint is inconsistent")
        tensors.update(found)
    return tensors, header_read
