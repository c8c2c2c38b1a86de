"""A GGUF checkpoint (llama.cpp's single-file format), read from its header alone: which file, what it holds.

A GGUF file is the magic "GGUF", a version, a tensor count and a metadata count, the metadata (key, value type,
value), one info per tensor (name, dimensions, ggml type, offset into the data section), padding to the file's
alignment, then the tensor data. Everything here comes from that header: no tensor data is read, so a file of any
size answers in a fraction of a second (walking the vocabulary's strings is most of it), and every count and
offset is checked against the file's size before it is used (a forged count is refused, never allocated or looped
over past the file's end; counts far past any real file's are refused outright: MAX_ENTRIES, MAX_TENSORS,
MAX_WALKED, MAX_NESTED; a numeric array is kept only as long as a per-layer one, MAX_KEPT items in all). The format's
names come from the `gguf` package (imported when a GGUF is read, not with this module): value and ggml types, each
type's block layout (GGML_QUANT_SIZES: elements per block, bytes per block), the metadata keys (gguf.Keys) and the
tensor names of each architecture (gguf.constants.TENSOR_NAMES, MODEL_TENSORS), from which a tensor's role and part
of the model follow. A tensor of a ggml type id the installed gguf package does not know is refused as a file newer
than the package reads (upgrade gguf, or write another type), not as a damaged file: llama.cpp writes new types
(Q2_0 is 42) before a gguf release names them.

The layout rules are llama.cpp's own (ggml/src/gguf.cpp): each tensor's offset is a multiple of the alignment and
equals the padded sizes of the tensors before it, each row holds whole blocks, and its bytes are

    bytes = elements / block_size × type_size

so the header bytes, the tensors' bytes and the padding account for the file to the byte.

A checkpoint is a GGUF (`find`) when its path is a file named `*.gguf` or starting with the magic "GGUF", or a
folder holding no safetensors file and exactly one `*.gguf` (its tokenizer files beside it), or the parts of one split
GGUF; a folder holding several models is refused, naming them.

A split GGUF (gguf's writer, llama.cpp's llama-gguf-split) is one model in several files: the first holds the
metadata, every part its `split.no` and `split.count`, the first `split.tensors.count`. llama.cpp loads it from the
first part and opens the others by name (NAME-00002-of-0000N.gguf beside it: the gguf package's SHARD_NAME_FORMAT),
so `read_header` does the same: the first part's header joined with every other part's (GGUFHeader.parts), each part
checked as llama.cpp checks it (its index, no tensor twice, the declared tensor count), and refused (UsageError)
where llama.cpp would refuse to load it, before it is opened. The identity (weights_sha256) hashes every part.

This module imports no other checkpoint module but architecture (the safetensors side's rules for a tensor's role and
part, which name a GGUF tensor's by the names it is converted from: role_of), so files.py may import it (for
`weights_sha256`) without a cycle; accounting.gguf_report turns a header into the BitsReport `quantize inspect` prints.
"""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
import os
import re
import stat
import struct
from collections.abc import Callable, Container
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from quantize import cache, progress
from quantize.checkpoint import architecture
from quantize.errors import UsageError
from quantize.io import open_user_file, sha256_bytes, sha256_user_file

MAGIC = b"GGUF"
SUFFIX = ".gguf"
MAX_GGUF_BYTES = 2**50  # no limit in practice: a GGUF is mapped, never read whole
MAX_ARRAY_DEPTH = 8  # arrays of arrays: llama.cpp writes none; a forged nesting is refused, not recursed into
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses a tensor of more dimensions
ALLOW_SYMLINKS = "QUANTIZE_ALLOW_SYMLINKS"  # files.ALLOW_SYMLINKS (not imported: files.py imports this module)
FIX = "re-download or re-convert the GGUF (llama.cpp's convert_hf_to_gguf.py writes one)"
BY_HAND = "Pass --params and --layers/--kv-heads/--head-dim instead"  # what `quantize cost` takes in the header's place

# struct formats of the scalar value types (the GGUF specification's sizes), keyed by GGUFValueType's name
_SCALARS = {
    "UINT8": "B",
    "INT8": "b",
    "UINT16": "H",
    "INT16": "h",
    "UINT32": "I",
    "INT32": "i",
    "FLOAT32": "f",
    "BOOL": "?",
    "UINT64": "Q",
    "INT64": "q",
    "FLOAT64": "d",
}
# llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h; llama-cpp-python exposes no such constant): its load_hparams
# asserts 0 < block_count <= it (a GGML_ASSERT: the process aborts), and its per-layer arrays hold that many entries
# at most. tests/compat/test_llama_cpp.py holds the installed llama.cpp to it.
LLAMA_MAX_LAYERS = 512
# numeric arrays are kept as lists up to this length: the arrays read here are per-layer values (head counts), and
# llama.cpp takes none longer; a longer one (a vocabulary's scores and token types) is skipped, only its length kept
MAX_KEPT_ARRAY = LLAMA_MAX_LAYERS
# numeric array items kept, all arrays together: a real GGUF keeps a few per-layer arrays (a tiny vocabulary's
# scores too); a forged header of thousands of short arrays is refused at once instead of kept item by item
MAX_KEPT = 1 << 16
# items of metadata arrays of strings or arrays, all arrays together: each is walked (its length says where the next
# starts), about a microsecond apiece; real vocabularies hold up to ~300k tokens and as many merges, so 4M leaves
# room, and a forged count past it is refused at once instead of walked for seconds
MAX_WALKED = 1 << 22
# arrays inside arrays, all together: each is walked (several microseconds apiece), and llama.cpp reads none (its
# gguf.cpp refuses an array of arrays as an invalid type), so a few suffice for a GGUF written by other tools
MAX_NESTED = 1 << 10
# a real GGUF has tens of metadata entries and at most a few thousand tensors; counts past these are refused at once
MAX_ENTRIES = 1 << 16
MAX_TENSORS = 1 << 18


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    ggml_type: str  # GGMLQuantizationType's name: F32, Q4_K, IQ2_XS, ...
    dims: tuple[int, ...]  # ggml order: dims[0] is the row (contiguous) length
    elements: int
    nbytes: int  # elements / block_size × type_size (GGML_QUANT_SIZES)
    offset: int  # into the data section
    block_size: int
    type_size: int

    @property
    def quantized(self) -> bool:
        """Block-quantized (a block of several elements shares its scales): every type but F32, F16, BF16, F64 and
        the integer types, as the library's block sizes say."""
        return self.block_size > 1


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF's header as read_header parsed it; shared between callers (read_header memoizes it), so never
    changed in place."""

    path: Path
    file_bytes: int
    version: int
    header_bytes: int  # magic, counts, metadata and tensor infos: everything before the alignment padding
    data_start: int  # the data section's first byte (header_bytes padded to the alignment)
    alignment: int
    metadata: dict[str, Any]  # scalars and strings by key; a numeric array up to MAX_KEPT_ARRAY values as a list
    tensors: list[GGUFTensor] = field(default_factory=list)
    # every metadata array's item type (GGUFValueType's name) and length by key, kept or not
    arrays: dict[str, tuple[str, int]] = field(default_factory=dict)
    # a split GGUF's files in llama.cpp's load order, `path` first; () for a GGUF in one file. Joined, file_bytes and
    # header_bytes are the parts' sums, tensors every part's (each offset into its own part's data section), and
    # version, data_start, alignment and metadata the first part's (the one llama.cpp reads the model's keys from)
    parts: tuple[Path, ...] = ()

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file llama.cpp reads to load it, in order."""
        return self.parts or (self.path,)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def padding_bytes(self) -> int:
        """Every byte of the file that is neither header nor tensor: the alignment padding (the file's size less
        the header's bytes and the tensors' bytes)."""
        return self.file_bytes - self.header_bytes - self.tensor_bytes

    @property
    def architecture(self) -> str | None:
        a = self.metadata.get("general.architecture")
        return a if isinstance(a, str) else None


# --- which file ---------------------------------------------------------------------------------


def _has_magic(path: Path) -> bool:
    """A regular file starting with "GGUF": opened non-blocking and checked with fstat before a byte is read, so a
    FIFO or a device is never read here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 4) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def find(checkpoint: str | Path) -> Path | None:
    """The GGUF file a checkpoint path names, or None when it is no GGUF checkpoint (a safetensors one): the path
    itself when it is named `*.gguf` (whatever it is: a FIFO so named is refused when read) or is a file starting
    with "GGUF"; in a folder with no safetensors file, its one `*.gguf` (several: a UsageError naming them; one
    linked outside the folder: refused unless QUANTIZE_ALLOW_SYMLINKS=1, as for safetensors; none in a folder itself
    named `*.gguf`: a UsageError saying so)."""
    p = Path(checkpoint)
    if not p.is_dir():
        return p if p.suffix.lower() == SUFFIX or _has_magic(p) else None
    try:
        names = sorted(e.name for e in os.scandir(p))
    except OSError:
        return None
    if any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        return None
    found = [p / n for n in names if n.lower().endswith(SUFFIX)]
    if not found and p.suffix.lower() == SUFFIX:
        raise UsageError(
            f"{p} is a folder named like a GGUF file, holding no .gguf (nor .safetensors) file; a GGUF checkpoint is "
            "the .gguf file itself, or a folder holding one: pass that"
        )
    if len(found) > 1 and (first := _first_of_split(found)) is not None:
        return _contained(p, first)
    if len(found) > 1:
        raise UsageError(
            f"{p} holds {len(found)} GGUF files ({', '.join(f.name for f in found[:5])}); a checkpoint folder holds "
            "one model: pass the .gguf file itself, or move the others out"
        )
    return _contained(p, found[0]) if found else None


_PART = re.compile(r"^(?P<prefix>.*)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf$")


def _first_of_split(found: list[Path]) -> Path | None:
    """The first part, where the GGUF files of a folder are all named as the parts of one split GGUF (one name, one
    part count: the gguf package's SHARD_NAME_FORMAT), else None; without its first part, a UsageError. Another
    part missing, or one not what its name says, is read_header's to refuse, naming it."""
    from gguf.gguf_writer import SHARD_NAME_FORMAT

    seen = set()
    for f in found:
        if (m := _PART.match(f.name)) is None:
            return None
        prefix, no, count = m["prefix"], int(m["no"]), int(m["count"])
        if SHARD_NAME_FORMAT.format(prefix, no, count) != f.name or not 1 <= no <= count:
            return None
        seen.add((prefix, count))
        if len(seen) > 1:
            return None
    prefix, count = next(iter(seen))
    first = found[0].with_name(SHARD_NAME_FORMAT.format(prefix, 1, count))
    if first not in found:
        raise UsageError(
            f"{first.parent} holds {len(found)} part(s) of a GGUF split into {count} files but not its first part, "
            f"{first.name}: llama.cpp loads a split model from its first part. Put every part in the folder"
        )
    return first


def _contained(folder: Path, f: Path) -> Path:
    """A folder's GGUF lies inside it once links are followed (a Hugging Face cache snapshot's blobs count as
    inside), else QUANTIZE_ALLOW_SYMLINKS=1 is needed: the rule files.contained applies to safetensors."""
    if os.environ.get(ALLOW_SYMLINKS) == "1":
        return f
    root = folder.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        root = root.parent.parent
    if not f.resolve().is_relative_to(root):
        raise UsageError(
            f"{f} links outside the checkpoint folder (to {f.resolve()}); copy the file in, or set "
            f"{ALLOW_SYMLINKS}=1 if the link is meant"
        )
    return f


def weights_sha256(checkpoint: str | Path) -> str | None:
    """The weights hash of a GGUF checkpoint (None for any other): sha256 over the line "NAME SHA256\\n" of each of
    its files (one, or a split GGUF's every part in load order: read_header), as files.weights_sha256 hashes
    safetensors files' lines, each sha256 taken from the file's bytes (read as a regular file: a FIFO or a device is
    refused unread). The identity (files.identity_sha256) adds the folder's config, tokenizer and chat-template files
    to it. Each file's sha256 is memoized in the process while its device, inode, size, mtime and ctime stay (as
    files.weights_sha256 memoizes a folder's): a scoring run asks for it several times, and a file replaced or
    written in place (its ctime moves, whatever else is put back) is hashed again. Hashed again to the same bytes
    (written and put back), it is still refused by files.check_identity, which holds a load to the stat keys its
    identity was taken with (a GGUF is scored from a memory map of the file, so a write during scoring reaches the
    loaded model)."""
    parts = weight_files(checkpoint)
    if parts is None:
        return None
    return sha256_bytes("".join(f"{p.name} {_file_sha256(p)}\n" for p in parts).encode())


def weight_files(checkpoint: str | Path) -> tuple[Path, ...] | None:
    """The files llama.cpp loads for a GGUF checkpoint (its one file, or a split GGUF's every part in load order:
    read_header), None for any other checkpoint."""
    f = find(checkpoint)
    if f is None:
        return None
    return read_header(f).files if _stat_key(f) is not None else (f,)  # not a regular file: the read refuses it


def _stat_key(path: Path) -> tuple[int, ...] | None:
    """What a memo of a file's contents is kept under: its device, inode, size, mtime and ctime (a file replaced or
    written in place moves its ctime, whatever else is put back); None for anything but a regular file, or one that
    cannot be stat'ed (never kept: the read that follows says what is wrong with it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _file_sha256(path: Path) -> str:
    """One GGUF file's sha256, read as a regular file; memoized under its stat key (weights_sha256)."""
    if (key := _stat_key(path)) is None:
        return _sha256(str(path))  # not kept: the read refuses whatever it is
    return _kept_sha256(str(path.resolve()), key)


@functools.lru_cache(maxsize=64)
def _kept_sha256(path: str, _stat_key: tuple[int, ...]) -> str:
    """`_sha256`, memoized under the file's stat key."""
    return _sha256(path)


def _sha256(path: str) -> str:
    return sha256_user_file(Path(path), "GGUF file", MAX_GGUF_BYTES, hint=FIX)


# --- what the tensors store -----------------------------------------------------------------------

# elements dequantized at a time (float32: 16 MiB, whatever the model's size): a tensor is scanned a chunk of whole
# rows at a time, so memory does not grow with the model
SCAN_ELEMENTS = 1 << 22
# 1 (2026-12-08): every tensor whose type gguf.quants.dequantize reads; kept in the identity memo under it
NON_FINITE_SCAN_VERSION = 2  # 2: F64 tensors scanned
# a file at least this large is scanned as a progress stage (its tensors counted): seconds a GiB on a 2-core CPU
SCAN_SHOWN_BYTES = 1 << 28


def non_finite_tensors(checkpoint: str | Path) -> list[str]:
    """The names of the tensors of a GGUF checkpoint whose stored values are not all finite (NaN or ±infinity), in
    name order; [] for a GGUF whose every value is finite and for any other checkpoint. Every tensor of every file
    (a split GGUF's every part) is dequantized by the gguf package itself (gguf.quants.dequantize: F32 and F16
    viewed, BF16 and every block type through its block layout, so a NaN scale of a Q4_K block is found as a NaN
    weight is), SCAN_ELEMENTS at a time; integer tensors hold no NaN, and a type the installed gguf package cannot
    dequantize is not scanned. llama.cpp can hide such a value (it rounds an activation to 8 bits before a Q8_0
    matrix, where a NaN element becomes a finite one; a NaN embedding row of a token no item holds is never read),
    so a gate makes it non-finite evidence whatever the scores say. Each file's result is memoized in the process
    and in the identity memo on disk ($QUANTIZE_CACHE/identity/, under the file's stat key and this machine's boot
    id, as a folder's weights hash is: files.lookup_weights_hash), so a scoring run, a gate and a report scan a
    file once per boot."""
    f = find(checkpoint)
    if f is None:
        return []
    return sorted(
        name for part in read_header(f).files for name in kept_scan(part, "gguf", NON_FINITE_SCAN_VERSION, _scan)
    )


def kept_scan(path: Path, kind: str, version: int, scan: Callable[[Path], tuple[str, ...]]) -> tuple[str, ...]:
    """One file's tensors storing non-finite values as `scan` finds them, memoized under its stat key (in the
    process, and in the identity memo as `{kind}-finite-`, `version` the scan's): a GGUF's here, a safetensors
    file's by checkpoint/finite.py. A file that is no regular file is scanned, not kept (the read refuses it)."""
    if (key := _stat_key(path)) is None:
        return scan(path)
    return _kept_scan(str(path.resolve()), key, kind, version, scan)


@functools.lru_cache(maxsize=64)
def _kept_scan(
    path: str, key: tuple[int, ...], kind: str, version: int, scan: Callable[[Path], tuple[str, ...]]
) -> tuple[str, ...]:
    memo = cache.memo_path("identity", f"{kind}-finite-", {"file": [path, *key], "v": version})
    found = cache.read_memo(memo, "non_finite_tensors")
    if isinstance(found, list) and all(isinstance(n, str) for n in found):
        return tuple(found)
    names = scan(Path(path))
    cache.write_memo(memo, {"non_finite_tensors": list(names)})
    return names


def scan_stage(path: Path, nbytes: int, tensors: int) -> contextlib.AbstractContextManager[progress.Stage | None]:
    """What a NaN scan of a file of `nbytes` holding `tensors` tensors shows (this one's, checkpoint/finite.py's): a
    progress stage advanced a tensor at a time where the file is at least SCAN_SHOWN_BYTES, else nothing (None)."""
    if nbytes >= SCAN_SHOWN_BYTES:
        return progress.stage(f"NaN scan of {path.name}", tensors, "tensors")
    return contextlib.nullcontext()


def _scan(path: Path) -> tuple[str, ...]:
    """The tensors of one GGUF file (its own header's) whose dequantized values are not all finite (scan_stage)."""
    import gguf

    h = _one_header(path)
    with (
        open_user_file(path, "GGUF file", MAX_GGUF_BYTES, hint=FIX) as fh,
        scan_stage(path, h.file_bytes, len(h.tensors)) as st,
    ):
        if os.fstat(fh.fileno()).st_size != h.file_bytes:
            raise _Invalid(path)("it changed while it was read")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            tensors = progress.counted(st, h.tensors)
            return tuple(t.name for t in tensors if not _finite(gguf, buf, h.data_start + t.offset, t))


def _finite(gguf: Any, buf: Any, start: int, t: GGUFTensor) -> bool:
    """Whether every value tensor `t` stores (its bytes at `start` of the mapped file) is finite, read a chunk of
    whole rows at a time; F64 viewed as little-endian float64 (gguf.quants.dequantize does not read it); True for
    another type it does not read (integers, or one newer than it)."""
    import numpy as np

    qtype = gguf.GGMLQuantizationType[t.ggml_type]
    if not t.elements:
        return True
    row = t.dims[0] // t.block_size * t.type_size  # bytes a row: whole blocks (_tensors checked it)
    step = max(1, SCAN_ELEMENTS // t.dims[0])
    for first in range(0, t.nbytes // row, step):
        rows = min(step, t.nbytes // row - first)
        data = np.frombuffer(buf, np.uint8, rows * row, start + first * row).reshape(rows, row)
        try:
            values = gguf.quants.dequantize(data, qtype)
        except NotImplementedError:  # F64, integers (no NaN), Q8_1/Q8_K/Q1_0: what gguf 0.19 does not dequantize
            if qtype != gguf.GGMLQuantizationType.F64:
                return True
            values = data.view("<f8")
        finite = bool(np.isfinite(values).all())
        del data, values  # no view of the map outlives it (closing a map with one raises BufferError)
        if not finite:
            return False
    return True


def gguf_version() -> str:
    """The installed gguf package's version, as messages name it."""
    try:
        return metadata.version("gguf")
    except metadata.PackageNotFoundError:
        return "version unknown"


# --- the header -----------------------------------------------------------------------------------


class _Invalid:
    """The one message of a bad GGUF: the file, what is wrong, what to do."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, why: str) -> UsageError:
        return UsageError(f"{self.path} is not a valid GGUF file: {why}. {FIX[0].upper()}{FIX[1:]}.")


class _Cursor:
    """Reads the header's fields in order, each checked to lie inside the file before it is read."""

    def __init__(self, buf: Any, size: int, order: str, bad: _Invalid):
        self.buf, self.size, self.order, self.bad = buf, size, order, bad
        self.pos = 0
        self.walked = 0  # items of metadata arrays of strings or arrays so far (MAX_WALKED)
        self.nested = 0  # arrays inside arrays so far (MAX_NESTED)
        self.kept = 0  # numeric array items kept so far (MAX_KEPT)
        self.arrays: dict[str, tuple[str, int]] = {}  # each top-level array's item type and length (GGUFHeader.arrays)

    def take(self, n: int, what: str) -> int:
        """Advance over n bytes; returns where they start."""
        if n < 0 or n > self.size - self.pos:
            raise self.bad(f"{what} at byte {self.pos} runs past the end of the {self.size:,}-byte file (truncated?)")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(self.order + fmt, self.buf, start)[0]

    def text(self, what: str) -> str:
        n = self.scalar("Q", f"the length of {what}")
        start = self.take(n, f"{what} ({n:,} bytes)")
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad(f"{what} at byte {start} is not UTF-8") from None


def read_header(path: Path) -> GGUFHeader:
    """Parse and check a GGUF's header (the module's rules); a UsageError names the file and what is wrong. A split
    GGUF's first part is joined with its other parts (_joined); any other part is refused, as llama.cpp refuses to
    load from it. Each file's header is memoized in the process while its device, inode, size, mtime and ctime stay
    (as weights_sha256 is): a scoring run reads the header several times (the engine's choice, the token check, the
    provenance), and walking a vocabulary's strings is a few tenths of a second each time. A refusal is never kept;
    a file replaced or written in place is read again."""
    h = _one_header(Path(path))
    return h if _split_count(h) == 1 else _joined(h)


def _one_header(path: Path) -> GGUFHeader:
    if (key := _stat_key(path)) is None:
        return _read_header(path)  # not kept: the read refuses whatever it is
    return _kept_header(path, key)


def _split_count(h: GGUFHeader) -> int:
    """How many files the GGUF `h` heads is split into (1: not split), its split.count checked."""
    import gguf

    key = gguf.Keys.Split.LLM_KV_SPLIT_COUNT
    count = h.metadata.get(key, 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 65535:
        raise _Invalid(h.path)(f"{key} is {count!r}; a split count is a whole number from 1 to 65535")
    return count


def _joined(first: GGUFHeader) -> GGUFHeader:
    """A split GGUF's header from its first part, as llama.cpp loads it (llama_model_loader): loaded from the first
    part (split.no 0) whose name ends in "-00001-of-0000N.gguf", the others opened beside it by name, each holding
    its index as split.no, no tensor name twice, and as many tensors in all as the first part's split.tensors.count.
    Each part is read as a regular file inside the first one's folder (the rule _contained applies), and its split.count
    must agree. Anything else is a UsageError naming the part and what to do."""
    import gguf
    from gguf.gguf_writer import SHARD_NAME_FORMAT

    keys = gguf.Keys.Split
    path, count, meta = first.path, _split_count(first), first.metadata
    merge = "or merge the parts into one file (llama.cpp's `llama-gguf-split --merge FIRST-PART OUT.gguf`)"
    no = meta.get(keys.LLM_KV_SPLIT_NO)
    if isinstance(no, bool) or not isinstance(no, int) or not 0 <= no < count:
        raise _Invalid(path)(f"it declares {keys.LLM_KV_SPLIT_COUNT} {count} and {keys.LLM_KV_SPLIT_NO} {no!r}")
    if no != 0:
        raise UsageError(
            f"{path} is part {no + 1} of a GGUF split into {count} files; llama.cpp loads a split model from its first "
            f"part only ({keys.LLM_KV_SPLIT_NO} 0, named NAME{SHARD_NAME_FORMAT.format('', 1, count)}): pass that "
            f"file, {merge}"
        )
    suffix = SHARD_NAME_FORMAT.format("", 1, count)
    if not path.name.endswith(suffix):
        raise UsageError(
            f"{path} is the first part of a GGUF split into {count} files, but its name does not end in {suffix!r}: "
            f"llama.cpp opens the other parts by that name ({SHARD_NAME_FORMAT.format('NAME', 2, count)}, ...) and "
            f"refuses a first part named otherwise. Give the parts their names back, {merge}"
        )
    prefix = path.name[: -len(suffix)]
    headers = [first]
    for i in range(1, count):
        part = path.with_name(SHARD_NAME_FORMAT.format(prefix, i + 1, count))
        if not os.path.lexists(part):
            raise UsageError(
                f"{path} is the first of {count} parts of a split GGUF, and part {i + 1}, {part.name}, is not beside "
                f"it; llama.cpp would open it there. Put every part in the folder, {merge}"
            )
        h = _one_header(_contained(path.parent, part))
        got = (h.metadata.get(keys.LLM_KV_SPLIT_NO), h.metadata.get(keys.LLM_KV_SPLIT_COUNT))
        if got != (i, count):
            raise UsageError(
                f"{part} is named part {i + 1} of {count} of {path.name}'s split GGUF, but its header says split.no "
                f"{got[0]!r} and split.count {got[1]!r} (expected {i} and {count}): the parts are not one model's. "
                f"Re-download or re-split it, {merge}"
            )
        headers.append(h)
    tensors = [t for h in headers for t in h.tensors]
    names: dict[str, Path] = {}
    for h in headers:
        for t in h.tensors:
            if t.name in names:
                raise UsageError(
                    f"tensor {t.name!r} is in both {names[t.name].name} and {h.path.name} of the split GGUF "
                    f"{path}; llama.cpp refuses a tensor stored twice. Re-download or re-split it, {merge}"
                )
            names[t.name] = h.path
    if (declared := meta.get(keys.LLM_KV_SPLIT_TENSORS_COUNT)) != len(tensors):
        raise UsageError(
            f"{path}'s {keys.LLM_KV_SPLIT_TENSORS_COUNT} is {declared!r}, but its {count} parts hold {len(tensors):,} "
            f"tensors; llama.cpp refuses a split GGUF whose count differs. Re-download or re-split it, {merge}"
        )
    return replace(
        first,
        file_bytes=sum(h.file_bytes for h in headers),
        header_bytes=sum(h.header_bytes for h in headers),
        tensors=tensors,
        parts=tuple(h.path for h in headers),
    )


@functools.lru_cache(maxsize=16)
def _kept_header(path: Path, _stat_key: tuple[int, ...]) -> GGUFHeader:
    """`_read_header`, memoized under the path and the file's stat key (read_header)."""
    return _read_header(path)


def _read_header(path: Path) -> GGUFHeader:
    import gguf

    bad = _Invalid(path)
    with open_user_file(path, "GGUF file", MAX_GGUF_BYTES, hint=FIX) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise bad(f"it is {size} bytes long, shorter than the 24-byte GGUF preamble")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(gguf, path, buf, size, bad)


def _parse(gguf: Any, path: Path, buf: Any, size: int, bad: _Invalid) -> GGUFHeader:
    if buf[:4] != MAGIC:
        raise bad(f"it starts with {bytes(buf[:4])!r}, not the magic b'GGUF'")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<"
    if version & 0xFFFF == 0:  # written on a big-endian machine: every number is byte-swapped
        order, (version,) = ">", struct.unpack_from(">I", buf, 4)
    if not 2 <= version <= gguf.GGUF_VERSION:
        raise bad(f"it is GGUF version {version}; this gguf package reads versions 2 to {gguf.GGUF_VERSION}")
    cur = _Cursor(buf, size, order, bad)
    cur.pos = 8
    n_tensors = cur.scalar("Q", "the tensor count")
    n_kv = cur.scalar("Q", "the metadata count")
    if n_kv > MAX_ENTRIES or n_tensors > MAX_TENSORS:
        raise bad(
            f"it declares {n_kv:,} metadata entries and {n_tensors:,} tensors; more than {MAX_ENTRIES:,} entries or "
            f"{MAX_TENSORS:,} tensors are not read (a real GGUF has tens of entries and thousands of tensors at most)"
        )
    # the smallest metadata entry is 13 bytes (key length, type, a one-byte value), the smallest tensor info 24
    if n_kv * 13 + n_tensors * 24 > size - cur.pos:
        raise bad(f"it declares {n_kv:,} metadata entries and {n_tensors:,} tensors, more than its {size:,} bytes hold")
    metadata = _metadata(gguf, cur, n_kv)
    infos = [_tensor_info(gguf, cur, i) for i in range(n_tensors)]
    alignment = metadata.get(gguf.Keys.General.ALIGNMENT, gguf.GGUF_DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise bad(f"{gguf.Keys.General.ALIGNMENT} is {alignment!r}; an alignment is a power of two")
    header_bytes = cur.pos
    data_start = -(-header_bytes // alignment) * alignment
    tensors = _tensors(infos, data_start, size, alignment, bad)
    return GGUFHeader(path, size, version, header_bytes, data_start, alignment, metadata, tensors, arrays=cur.arrays)


def _metadata(gguf: Any, cur: _Cursor, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(count):
        key = cur.text(f"metadata key {i}")
        if key in out:
            raise cur.bad(f"metadata key {key!r} appears twice")
        out[key] = _value(gguf, cur, cur.scalar("I", f"the type of {key!r}"), key, 0)
    return out


def _value_type(gguf: Any, cur: _Cursor, raw: int, key: str) -> Any:
    try:
        return gguf.GGUFValueType(raw)
    except ValueError:
        raise cur.bad(f"metadata {key!r} has value type {raw}, which GGUF does not define") from None


def _value(gguf: Any, cur: _Cursor, raw: int, key: str, depth: int) -> Any:
    """One metadata value: a scalar or a string as itself, an array as _array reads it."""
    t = _value_type(gguf, cur, raw, key)
    if t.name in _SCALARS:
        return cur.scalar(_SCALARS[t.name], f"the value of {key!r}")
    if t == gguf.GGUFValueType.STRING:
        return cur.text(f"the value of {key!r}")
    return _array(gguf, cur, key, depth)


def _array(gguf: Any, cur: _Cursor, key: str, depth: int) -> list[Any] | None:
    """A top-level numeric array of up to MAX_KEPT_ARRAY items as a list (MAX_KEPT items in all); any other array
    skipped over, its items checked to lie inside the file, its strings and arrays counted (_walk) before one is
    walked. A top-level array's item type and length go into cur.arrays, kept or not."""
    if depth >= MAX_ARRAY_DEPTH:
        raise cur.bad(f"metadata {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep")
    item = _value_type(gguf, cur, cur.scalar("I", f"the item type of {key!r}"), key)
    n = cur.scalar("Q", f"the length of {key!r}")
    smallest = struct.calcsize(_SCALARS[item.name]) if item.name in _SCALARS else (8 if item.name == "STRING" else 12)
    if n * smallest > cur.size - cur.pos:
        raise cur.bad(
            f"metadata {key!r} declares {n:,} items of at least {smallest} bytes at byte {cur.pos}, more than the "
            f"{cur.size - cur.pos:,} bytes left in the file"
        )
    if depth == 0:
        cur.arrays[key] = (item.name, n)
    if item.name in _SCALARS:
        start = cur.take(n * smallest, f"the items of {key!r}")
        if depth or n > MAX_KEPT_ARRAY:
            return None
        cur.kept += n
        if cur.kept > MAX_KEPT:
            raise cur.bad(
                f"metadata {key!r} brings its numeric arrays of up to {MAX_KEPT_ARRAY} items to {cur.kept:,} items; "
                f"more than {MAX_KEPT:,} are not read (a real GGUF holds a few per-layer arrays)"
            )
        return list(struct.unpack_from(f"{cur.order}{n}{_SCALARS[item.name]}", cur.buf, start))
    _walk(cur, key, n, nested=item == gguf.GGUFValueType.ARRAY)
    for _ in range(n):
        if item == gguf.GGUFValueType.STRING:
            cur.take(cur.scalar("Q", f"a string's length in {key!r}"), f"a string of {key!r}")
        else:
            _array(gguf, cur, key, depth + 1)
    return None


def _walk(cur: _Cursor, key: str, n: int, nested: bool) -> None:
    """Count n strings or arrays about to be walked, refused past MAX_WALKED (and arrays past MAX_NESTED)."""
    if nested:
        cur.nested += n
        if cur.nested > MAX_NESTED:
            raise cur.bad(
                f"metadata {key!r} brings its arrays inside arrays to {cur.nested:,}; more than {MAX_NESTED:,} are "
                "not read (llama.cpp reads no array of arrays)"
            )
    cur.walked += n
    if cur.walked > MAX_WALKED:
        raise cur.bad(
            f"metadata {key!r} brings its arrays to {cur.walked:,} strings or arrays; more than {MAX_WALKED:,} are "
            "not read (a real vocabulary holds a few hundred thousand)"
        )


@dataclass(frozen=True)
class _Info:
    name: str
    dims: tuple[int, ...]
    raw_type: int
    offset: int
    at: int  # where the info starts in the file


def _tensor_info(gguf: Any, cur: _Cursor, i: int) -> _Info:
    at = cur.pos
    name = cur.text(f"tensor {i}'s name")
    n_dims = cur.scalar("I", f"the dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.bad(f"tensor {name!r} has {n_dims} dimensions; ggml tensors have 1 to {MAX_DIMS}")
    start = cur.take(8 * n_dims, f"the dimensions of tensor {name!r}")
    dims = struct.unpack_from(f"{cur.order}{n_dims}Q", cur.buf, start)
    raw_type = cur.scalar("I", f"the type of tensor {name!r}")
    offset = cur.scalar("Q", f"the offset of tensor {name!r}")
    return _Info(name, tuple(dims), raw_type, offset, at)


def _tensors(infos: list[_Info], data_start: int, size: int, alignment: int, bad: _Invalid) -> list[GGUFTensor]:
    """Each tensor checked as llama.cpp checks it: a unique name, a known ggml type, rows of whole blocks, and the
    offset the padded sizes before it give (so none overlaps, none leaves a gap); and its bytes inside the file."""
    import gguf

    out: list[GGUFTensor] = []
    names: set[str] = set()
    expected = 0
    for info in infos:
        if info.name in names:
            raise bad(f"tensor {info.name!r} appears twice")
        names.add(info.name)
        try:
            t = gguf.GGMLQuantizationType(info.raw_type)
            block_size, type_size = gguf.GGML_QUANT_SIZES[t]
        except (ValueError, KeyError):
            raise UsageError(
                f"{bad.path}: tensor {info.name!r} has ggml type {info.raw_type}, which the installed gguf package "
                f"({gguf_version()}) does not know: the file is newer than this gguf package reads (llama.cpp "
                "writes types before the gguf package names them). Upgrade it (`pip install -U gguf`), or write "
                "the GGUF in another type"
            ) from None
        if info.dims[0] % block_size:
            raise bad(
                f"tensor {info.name!r} ({t.name}, dims {list(info.dims)}) has rows of {info.dims[0]} elements, not a "
                f"multiple of the {block_size}-element block"
            )
        elements = math.prod(info.dims)
        nbytes = elements // block_size * type_size
        if info.offset != expected:
            raise bad(
                f"tensor {info.name!r} starts at data offset {info.offset:,}; the tensors before it end, padded to "
                f"{alignment} bytes, at {expected:,}"
            )
        if data_start + info.offset + nbytes > size:
            raise bad(
                f"tensor {info.name!r} ({t.name}, {nbytes:,} bytes at byte {data_start + info.offset:,}) runs past "
                f"the end of the {size:,}-byte file (truncated?)"
            )
        expected += -(-nbytes // alignment) * alignment
        out.append(GGUFTensor(info.name, t.name, info.dims, elements, nbytes, info.offset, block_size, type_size))
    if out and size > data_start + expected:
        raise bad(
            f"{size - data_start - expected:,} bytes follow the last tensor's padding, which no tensor holds; the "
            "file was written by something other than a GGUF writer, or appended to"
        )
    return out


# --- what each tensor is ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRole:
    role: str  # accounting.ROLES: payload, embedding, lm_head, norm, bias, linear_kept, other
    part: str  # architecture.PARTS
    layer: int | None  # the block (`blk.N.`) it is in
    kind: str | None  # gguf.constants.MODEL_TENSOR's name (None: a name the library does not know)


_EMBEDDINGS = ("TOKEN_EMBD", "POS_EMBD", "TOKEN_TYPES", "PER_LAYER_TOKEN_EMBD")
# the roles of the safetensors accounting (architecture.ROLE_RULES) a GGUF tensor takes from the names its kind is
# converted from (_source_role): a recurrent mixer's own parameters, a causal convolution's kernel, and a per-head or
# per-layer scalar the computation adds or multiplies (gpt-oss's attention sinks, a layer's output scale)
_SOURCE_ROLES = ("state", "conv", "scalar")
# the parts of a mixer part_of may name a kind of the gguf package's state-space group (SSM_*) by: Kimi Delta
# Attention's tensors come from `self_attn` modules, which the safetensors side makes linear attention by its layer
# (architecture.linear_attention_layers); a GGUF's SSM_* tensors are a recurrent layer's whatever their module
_STATE_SPACE_PARTS = {"attention": "linear_attention"}

Patterns = list[tuple[re.Pattern[str], str, str | None]]


def name_patterns(architecture: str | None) -> Patterns:
    """(pattern of a tensor's name less its suffix, MODEL_TENSOR name, its part where _part cannot tell it from the
    name), for the architecture's tensors first (gguf.constants.MODEL_TENSORS), then every tensor name the library
    knows. The third is a recurrent mixer's part (_mixer_parts): None for the kinds _part names and for those of
    another architecture."""
    import gguf
    from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

    arch = next((a for a, n in MODEL_ARCH_NAMES.items() if n == architecture), None)
    kinds = list(MODEL_TENSORS.get(arch, [])) if arch is not None else []
    mixers = _mixer_parts(tuple(k.name for k in kinds))
    kinds += [k for k in gguf.MODEL_TENSOR if k not in kinds and k in TENSOR_NAMES]
    return [
        (re.compile(re.escape(TENSOR_NAMES[k]).replace(r"\{bid\}", r"(\d+)") + "$"), k.name, mixers.get(k.name))
        for k in kinds
    ]


def _sources(kind: str) -> tuple[str, ...]:
    """The Hugging Face module names the gguf package converts into tensors of `kind` (gguf.TensorNameMap: the
    names convert_hf_to_gguf.py maps), a block's `{bid}` as block 0."""
    import gguf
    from gguf.tensor_mapping import TensorNameMap

    k = gguf.MODEL_TENSOR[kind]
    names = (*TensorNameMap.mappings_cfg.get(k, ()), *TensorNameMap.block_mappings_cfg.get(k, ()))
    return tuple(n.replace("{bid}", "0") for n in names)


@functools.cache
def _mixer_parts(kinds: tuple[str, ...]) -> dict[str, str]:
    """The part of each of an architecture's `kinds` that _part leaves `other` (a state-space or short-convolution
    mixer's), as the safetensors side's part_of names the modules the gguf package converts them from (_sources):
    within each group of kinds (the MODEL_TENSOR name's first word: SSM, SHORTCONV, ...), the one part every kind's
    sources may be, where there is one (Falcon-H1's SSM_D comes from Mamba modules alone, Qwen3-Next's SSM_BETA_ALPHA
    from a linear attention's, LFM2's SHORTCONV_* from its short convolution); none where the sources disagree."""
    mixer = [k for k in kinds if _part(k, "") == "other" and "NORM" not in k and k not in (*_EMBEDDINGS, "OUTPUT")]
    groups: dict[str, set[str]] = {}
    for k in mixer:
        if seen := {architecture.part_of(n, "") for n in _sources(k)} - {"other"}:
            group = k.split("_")[0]
            groups[group] = groups[group] & seen if group in groups else seen
    out = {}
    for k in mixer:
        if len(found := groups.get(k.split("_")[0], set())) == 1:
            part = next(iter(found))
            out[k] = _STATE_SPACE_PARTS.get(part, part) if k.startswith("SSM_") else part
    return out


@functools.cache
def _source_role(kind: str, suffix: str | None) -> str | None:
    """The role the safetensors accounting's ROLE_RULES give every name `kind` is converted from (_sources, with the
    GGUF tensor's suffix), where it is one of _SOURCE_ROLES: `state` for SSM_A and SSM_D (Mamba's A_log, D), `conv`
    for the convolutions' `.weight` (conv1d, LFM2's conv.conv), `scalar` for ATTN_SINKS; else None. Where the names
    with the suffix have no role, the names without it are asked: llama.cpp's converter appends `.weight` to a bare
    parameter (gpt-oss's and Granite's `self_attn.sinks` become `blk.N.attn_sinks.weight`)."""

    def role(suffixed: bool) -> str | None:
        roles = {architecture.rule_role(f"{n}.{suffix}" if suffixed else n) for n in _sources(kind)} - {None}
        return roles.pop() if len(roles) == 1 and roles <= set(_SOURCE_ROLES) else None

    return (role(True) if suffix else None) or (role(False) if suffix in (None, "weight") else None)


def role_of(t: GGUFTensor, patterns: Patterns, stored: Container[str], mtp_from: int | None = None) -> TensorRole:
    """A tensor's role and part from the MODEL_TENSOR its name is (a bias by its `.bias` suffix; a linear weight is
    `payload` when block-quantized, `linear_kept` when stored as floats), as the safetensors accounting names the
    tensors the gguf package converts into that kind (_source_role: a recurrent mixer's `state`, a convolution's
    `conv`; _mixer_parts: the Mamba, linear-attention and short-convolution parts). A name that is a MODEL_TENSOR's
    whole, with no suffix (llama.cpp's `blk.N.ssm_a` and `blk.N.ssm_d`, a Mamba's state-space parameters), is no
    weight: its source's role, else `other` but for a norm, an embedding or the output layer. A recurrent mixer's
    bias with no weight of its own among `stored` (the header's tensor names: llama.cpp's converter writes Mamba2's
    and Gated DeltaNet's dt_bias as `ssm_dt.bias`, no `ssm_dt.weight` beside it) is `state`, as dt_bias is on the
    safetensors side. Every tensor of a block N >= `mtp_from` (the header's first multi-token-prediction block:
    mtp_blocks) is part `mtp`, its experts included."""
    base, _, suffix = t.name.rpartition(".")
    base = base or suffix
    kind, layer, mixer = _kind(base, patterns)
    if kind is None and base != t.name:
        kind, layer, mixer = _kind(t.name, patterns)
        suffix = None
    if kind is None:
        return TensorRole("other", "other", layer, None)
    if "NORM" in kind:
        role = "norm"
    elif kind == "OUTPUT":
        role = "lm_head"
    elif kind in _EMBEDDINGS:
        role = "embedding"
    elif source := _source_role(kind, suffix):
        role = source
    elif suffix == "bias":
        role = "state" if mixer and f"{base}.weight" not in stored else "bias"
    elif suffix is not None and len(t.dims) >= 2:
        role = "payload" if t.quantized else "linear_kept"
    else:
        role = "other"
    if mtp_from is not None and layer is not None and layer >= mtp_from:
        part = "mtp"
    else:
        part = mixer if mixer and role not in ("norm", "embedding", "lm_head") else _part(kind, role)
    return TensorRole(role, part, layer, kind)


def _kind(name: str, patterns: Patterns) -> tuple[str | None, int | None, str | None]:
    """The MODEL_TENSOR `name` is (the first of `patterns` that matches it), its block and its mixer's part (None
    where _part names it), or (None, None, None)."""
    for pattern, k, mixer in patterns:
        if m := pattern.match(name):
            return k, (int(m.group(1)) if m.groups() else None), mixer
    return None, None, None


def mtp_blocks(h: GGUFHeader) -> range:
    """The blocks a header declares multi-token prediction (MTP): the last `{arch}.nextn_predict_layers` of its
    `{arch}.block_count`, as llama.cpp's converter keeps DeepSeek-V3/V3.2's and GLM-4.5's MTP layers (blk.N for N
    from block_count − nextn on; a plain decode step does not read them). Empty where the header declares none, or
    declares counts that are not whole numbers with fewer MTP layers than blocks (the accounting by part must not
    fail: check_layers refuses more MTP layers than blocks where a model is read, latent_shape as many)."""
    import gguf

    arch = h.architecture or ""
    blocks = h.metadata.get(gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch))
    nextn = h.metadata.get(gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch))
    if not (_whole(blocks, 1) and _whole(nextn, 1)) or nextn >= blocks:
        return range(0)
    return range(blocks - nextn, blocks)


def mtp_stored(h: GGUFHeader) -> list[int]:
    """The multi-token-prediction blocks (mtp_blocks) that hold a tensor of the header, in order."""
    declared = mtp_blocks(h)
    if not declared:
        return []
    patterns, stored = name_patterns(h.architecture), {t.name for t in h.tensors}
    return sorted({r.layer for t in h.tensors if (r := role_of(t, patterns, stored, declared.start)).part == "mtp"})


def _part(kind: str, role: str) -> str:
    if role in ("embedding", "lm_head", "norm"):
        return role
    if "SHEXP" in kind:
        return "shared_experts"
    if kind.startswith("FFN_GATE_INP") or kind == "FFN_EXP_PROBS_B":
        return "router"
    if kind.endswith("_EXP"):
        return "routed_experts"
    if kind.startswith("FFN_"):
        return "mlp"
    if kind.startswith("ATTN_"):
        return "attention"
    return "other"


# --- the model's shape, for the KV cache -------------------------------------------------------------


def windowed_or_latent(h: GGUFHeader) -> list[str]:
    """The metadata keys the header holds that make its KV cache other than one MHA/GQA figure per layer: a sliding
    window (`{arch}.attention.sliding_window`), a latent cache (`kv_lora_rank`, `key_length_mla`: latent_shape
    prices it), or a per-layer array of KV heads (per_layer_shape prices it, where nothing else is declared)."""
    import gguf

    arch = h.architecture or ""
    a = gguf.Keys.Attention
    found = [k.format(arch=arch) for k in (a.SLIDING_WINDOW, a.KV_LORA_RANK, a.KEY_LENGTH_MLA)]
    found = [k for k in found if k in h.metadata]
    if isinstance(h.metadata.get(a.HEAD_COUNT_KV.format(arch=arch)), list):
        found.append(a.HEAD_COUNT_KV.format(arch=arch))
    return found


@dataclass(frozen=True)
class PerLayerShape:
    """A KV cache whose heads are given per layer (`{arch}.attention.head_count` or `head_count_kv` an array), from
    the header alone (per_layer_shape)."""

    kv_heads: tuple[int, ...]  # per layer; 0: a layer that keeps no KV cache
    key_length: int
    value_length: int
    formula: str


def recurrent_state_keys(h: GGUFHeader) -> list[str]:
    """The header's keys of a fixed recurrent, state-space or convolution state (the gguf package's SSM, WKV, KDA and
    ShortConv keys): a cache llama.cpp sizes by each family's own rule."""
    import gguf

    arch = h.architecture or ""
    groups = [getattr(gguf.Keys, g, None) for g in ("SSM", "WKV", "KDA", "ShortConv")]
    found = (v.format(arch=arch) for g in groups if g is not None for n, v in vars(g).items() if not n.startswith("_"))
    return sorted(k for k in found if k in h.metadata)


# bytes of an element of llama.cpp's recurrent state (its llama_memory_recurrent's R and S tensors: F32, its load log's
# `R (f32)`, `S (f32)`), whatever the model's weights
RECURRENT_STATE_BYTES = 4
RECURRENT_STATE_DTYPE = f"F32, {RECURRENT_STATE_BYTES} bytes: llama.cpp's recurrent state"  # as `cost` states it


@dataclass(frozen=True)
class RecurrentState:
    """The fixed state llama.cpp keeps for a sequence in each recurrent layer (llama_memory_recurrent), from the
    header alone: `r` values of its convolution state (R) and `s` of its state-space state (S), F32 each."""

    r: int
    s: int
    formula: str

    @property
    def bytes(self) -> int:
        """A layer's state for one sequence, R and S at RECURRENT_STATE_BYTES a value."""
        return (self.r + self.s) * RECURRENT_STATE_BYTES


def recurrent_state(h: GGUFHeader) -> RecurrentState | None:
    """The state each short-convolution layer of a header keeps as llama.cpp sizes it (llama_hparams' n_embd_r and
    n_embd_s), where the header declares a short convolution (`{arch}.shortconv.l_cache`, LFM2) and no other
    recurrent state: R = embedding_length × (l_cache − 1) values (the last inputs but the one a step brings), no S,
    F32 (RECURRENT_STATE_BYTES); else None. A Mamba state space (`{arch}.ssm.*`: mamba_layers reads the Mamba2
    hybrids'), RWKV's and Kimi's are not read here: which of their layers keep a state is each family's code. Which
    layers keep the short convolution's is the caller's to say (llama.cpp: those of no KV head). A key the rule
    reads that is no whole number is refused (UsageError)."""
    import gguf

    arch = h.architecture or ""
    l_cache, embedding = gguf.Keys.ShortConv.L_CACHE.format(arch=arch), gguf.Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)
    if recurrent_state_keys(h) != [l_cache]:
        return None
    for k in (embedding, l_cache):
        if not _whole(h.metadata.get(k), 1):
            got = "is absent" if k not in h.metadata else f"is {_shown(h, k)}"
            raise UsageError(
                f"{h.path}: {k} {got}; llama.cpp sizes each short-convolution layer's state by it, a whole number "
                f"from 1 to {COUNT_LIMIT - 1:,} (32 bits). {FIX[0].upper()}{FIX[1:]}"
            )
    n, cache = h.metadata[embedding], h.metadata[l_cache]
    return RecurrentState(
        r=n * (cache - 1),
        s=0,
        formula=f"R: embedding_length {n} × (shortconv.l_cache {cache} − 1) at F32 [llama.cpp's recurrent state]",
    )


# the llama.cpp whose code mamba_layers follows: the one llama-cpp-python 0.3.36 vendors (vendor/llama.cpp/src)
LLAMA_CPP_READ = "the llama.cpp llama-cpp-python 0.3.36 vendors"


@dataclass(frozen=True)
class MambaLayers:
    """A Mamba2 hybrid's decode cache as llama.cpp allocates it, from the header alone (mamba_layers)."""

    kv: PerLayerShape  # each block's KV heads where llama.cpp keeps a KV cache for it, else 0
    recurrent: tuple[bool, ...]  # per block: llama.cpp keeps a Mamba2 state for it
    state: RecurrentState  # the state of each such block
    rule: str  # which blocks keep what, and where llama.cpp's code says so
    refused: str  # why that llama.cpp does not load the GGUF at all; "" where the header shows no reason


def _mamba2_rules() -> dict[str, tuple[Callable[[int, int], bool], Callable[[int, int], bool], str]]:
    """architecture -> (is the block recurrent, given its KV heads and feed-forward length; does it keep a KV cache,
    given the same; where llama.cpp says so), for the Mamba2 hybrids, as LLAMA_CPP_READ's code lays out their
    memory: each family's load_arch_hparams (src/models/<family>.cpp) fills hparams.is_recr_impl, and
    llama_model::create_memory (src/llama-model.cpp) gives its llama_memory_hybrid the layer filters of the KV cache
    (filter_attn) and of the recurrent state (filter_recr); a null filter is llama_memory_hybrid's default
    (src/llama-memory-hybrid.cpp: KV where !is_recr(il), state where is_recr(il))."""
    import gguf

    names, arch = gguf.MODEL_ARCH_NAMES, gguf.MODEL_ARCH
    nemotron = (
        lambda kv, ff: kv == 0 and ff == 0,
        lambda kv, ff: kv != 0 and ff == 0,  # !is_recr(il) && n_ff(il) == 0
        "a Mamba2 state in each block of no KV head and no feed-forward length, a KV cache in each other block of no "
        "feed-forward length, neither in the rest (src/models/nemotron-h.cpp load_arch_hparams: is_recr = "
        "n_head_kv(il) == 0 && n_ff(il) == 0; src/llama-model.cpp create_memory: NEMOTRON_H's filter_attn "
        "!is_recr(il) && n_ff(il) == 0, filter_recr is_recr(il) && n_ff(il) == 0)",
    )
    return {
        names[arch.FALCON_H1]: (
            lambda kv, ff: True,
            lambda kv, ff: True,
            "a KV cache and a Mamba2 state in every block (src/models/falcon-h1.cpp load_arch_hparams: is_recr in "
            "every layer; src/llama-model.cpp create_memory: FALCON_H1's filter_attn and filter_recr keep every layer)",
        ),
        names[arch.GRANITE_HYBRID]: (
            lambda kv, ff: kv == 0,
            lambda kv, ff: kv != 0,
            "a Mamba2 state in each block of no KV head, a KV cache in the others (src/models/granite-hybrid.cpp "
            "load_arch_hparams: is_recr = n_head_kv(il) == 0; llama_memory_hybrid's default filters)",
        ),
        names[arch.NEMOTRON_H]: nemotron,
        names[arch.NEMOTRON_H_MOE]: nemotron,  # llama_model_nemotron_h_moe derives from llama_model_nemotron_h
    }


def mamba_layers(h: GGUFHeader) -> MambaLayers | None:
    """The decode cache LLAMA_CPP_READ allocates for a Mamba2 hybrid's GGUF (Falcon-H1, Granite 4 `granitehybrid`,
    Nemotron-H `nemotron_h`/`nemotron_h_moe`), from its header alone; None for another architecture. Which blocks
    keep a KV cache and which a Mamba2 state is each family's code (_mamba2_rules), read from each block's KV heads
    (`{arch}.attention.head_count_kv`, as per_layer_shape reads it) and feed-forward length
    (`{arch}.feed_forward_length`, a number or one per block; absent: 0). A block keeping KV keeps kv_heads ×
    (key_length + value_length) values a token, at the KV cache's type; one keeping a state keeps, whatever the
    model's weights, F32 (RECURRENT_STATE_BYTES; llama_model::create_memory's GGML_TYPE_F32) values: its
    convolution state R = (ssm.conv_kernel − 1) × (ssm.inner_size + 2 × ssm.group_count × ssm.state_size) and its
    state-space state S = ssm.state_size × ssm.inner_size (src/llama-hparams.cpp n_embd_r, n_embd_s; one row of
    each per sequence: src/llama-memory-recurrent.cpp), in the decode blocks only (the first block_count −
    nextn_predict_layers: its n_layer()). An SSM key the sizes read, or ssm.time_step_rank (read by the same
    load_arch_hparams), that is not a 32-bit whole number of at least 1 is refused (UsageError: llama.cpp requires
    each). `refused` says where that llama.cpp cannot load the GGUF at all because a block it takes as a Mamba2 layer
    stores no `ssm_in` weight, or one it takes as attention no `attn_q` weight (its load_arch_tensors requires them:
    converter GGUFs of Granite 4 and Nemotron-H models from transformers 5.17 are such, their layer kinds written as
    other head counts and feed-forward lengths)."""
    import gguf

    arch = h.architecture or ""
    if (rule := _mamba2_rules().get(arch)) is None:
        return None
    is_recurrent, keeps_kv, said = rule
    meta = h.metadata
    sizes = {}
    for name in ("CONV_KERNEL", "INNER_SIZE", "STATE_SIZE", "GROUP_COUNT", "TIME_STEP_RANK"):
        k = getattr(gguf.Keys.SSM, name).format(arch=arch)
        if not _whole(meta.get(k), 1):
            got = "is absent" if k not in meta else f"is {_shown(h, k)}"
            raise UsageError(
                f"{h.path}: {k} {got}; {LLAMA_CPP_READ} requires it (each family's load_arch_hparams reads it; the "
                "first four ssm sizes size each Mamba2 layer's state), a whole number from 1 to "
                f"{COUNT_LIMIT - 1:,} (32 bits). {FIX[0].upper()}{FIX[1:]}"
            )
        sizes[name] = meta[k]
    kernel, inner, state, groups = (sizes[n] for n in ("CONV_KERNEL", "INNER_SIZE", "STATE_SIZE", "GROUP_COUNT"))
    shape = _head_shape(h)
    blocks = len(shape.kv_heads)
    ff_key = gguf.Keys.LLM.FEED_FORWARD_LENGTH.format(arch=arch)
    ff = _per_block(h, ff_key) if ff_key in meta else [0] * blocks
    nextn = meta.get(gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch))
    _some_decode(h, blocks, nextn if _whole(nextn, 0) else 0)
    decode = blocks - len(mtp_blocks(h))
    recurrent = tuple(
        i < decode and is_recurrent(kv, f) for i, (kv, f) in enumerate(zip(shape.kv_heads, ff, strict=True))
    )
    kv = tuple(n if keeps_kv(n, f) else 0 for n, f in zip(shape.kv_heads, ff, strict=True))
    stored = {t.name for t in h.tensors}
    refused = ""
    for i in range(decode):
        need = [gguf.MODEL_TENSOR.SSM_IN] if recurrent[i] else []
        need += [gguf.MODEL_TENSOR.ATTN_Q] if keeps_kv(shape.kv_heads[i], ff[i]) else []
        missing = [n for t in need if (n := f"{gguf.TENSOR_NAMES[t].format(bid=i)}.weight") not in stored]
        if missing:
            what = "a Mamba2 layer" if recurrent[i] else "an attention layer"
            refused = (
                f"{LLAMA_CPP_READ} does not load this GGUF (the figures are what it would allocate): it takes block "
                f"{i} as {what} by its rule for {arch} ({ff_key} {ff[i]}, "
                f"{gguf.Keys.Attention.HEAD_COUNT_KV.format(arch=arch)} {shape.kv_heads[i]}), which stores no "
                f"{missing[0]}"
            )
            break
    r, s = (kernel - 1) * (inner + 2 * groups * state), state * inner
    return MambaLayers(
        kv=replace(shape, kv_heads=kv),
        recurrent=recurrent,
        state=RecurrentState(
            r=r,
            s=s,
            formula=f"R: (ssm.conv_kernel {kernel} − 1) × (ssm.inner_size {inner} + 2 × ssm.group_count {groups} × "
            f"ssm.state_size {state}) + S: ssm.state_size {state} × ssm.inner_size {inner}, at F32 [llama.cpp's "
            "recurrent state]",
        ),
        rule=f"{LLAMA_CPP_READ}: {said}",
        refused=refused,
    )


def per_layer_shape(h: GGUFHeader) -> PerLayerShape | None:
    """The KV cache of a header whose `{arch}.attention.head_count` or `head_count_kv` is an array (one entry per
    block: check_layers) and that declares nothing else shaping its cache (no window nor latent cache:
    windowed_or_latent; no recurrent state: recurrent_state_keys), else None. Read as llama.cpp's load_hparams reads
    them for every architecture: layer l's KV heads are head_count_kv[l] (head_count[l] where head_count_kv is
    absent; a number: the same in every layer), each key_length + value_length values (absent: embedding_length /
    head_count[0], its n_embd / n_head()), so layer l keeps kv_heads[l] × (key_length + value_length) values a token,
    none where kv_heads[l] is 0: the cache llama.cpp allocates (with flash attention; without it llama.cpp pads
    every layer's V to the widest layer's, so this is the lower bound). Refused (UsageError) where llama.cpp cannot
    load it: a head count not one whole number per block, a key_length/value_length that is not one whole number
    (llama.cpp refuses an array), no embedding_length to take a head size from, and no query head in layer 0 (then
    llama.cpp takes every head as 0 values wide, key_length unread, and refuses any layer's attention weights)."""
    import gguf

    arch = h.architecture or ""
    a, meta = gguf.Keys.Attention, h.metadata
    heads_key, kv_key = a.HEAD_COUNT.format(arch=arch), a.HEAD_COUNT_KV.format(arch=arch)
    if not any(isinstance(meta.get(k), list) for k in (heads_key, kv_key)):
        return None
    if [k for k in windowed_or_latent(h) if k != kv_key] or recurrent_state_keys(h):
        return None
    return _head_shape(h)


def _per_block(h: GGUFHeader, key: str) -> list[int]:
    """A key llama.cpp reads one whole number per block of (its get_key_or_arr): an array of `{arch}.block_count`
    whole numbers, or one number for every block; else refused (UsageError)."""
    import gguf

    blocks_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=h.architecture or "")
    blocks, v = h.metadata.get(blocks_key), h.metadata.get(key)
    if isinstance(v, list) and len(v) == blocks and all(_whole(n, 0) for n in v):
        return v
    if not isinstance(v, list) and _whole(v, 0) and _whole(blocks, 1):
        return [v] * blocks
    raise UsageError(
        f"{h.path}: {key} is {_shown(h, key)}, not one whole number per block ({blocks_key} {blocks}). "
        f"{FIX[0].upper()}{FIX[1:]}"
    )


def _head_shape(h: GGUFHeader) -> PerLayerShape:
    """Each block's KV heads and the head sizes, read as llama.cpp's load_hparams reads them for every architecture
    (per_layer_shape says how); refused (UsageError) where llama.cpp cannot load them."""
    import gguf

    arch = h.architecture or ""
    a, meta = gguf.Keys.Attention, h.metadata
    heads_key, kv_key = a.HEAD_COUNT.format(arch=arch), a.HEAD_COUNT_KV.format(arch=arch)
    if heads_key not in meta or not (heads := _per_block(h, heads_key))[0]:
        said = "is absent" if heads_key not in meta else f"is {_shown(h, heads_key)}, no head in layer 0"
        raise UsageError(
            f"{h.path}: {heads_key} {said}: llama.cpp then takes every head as 0 values wide (its n_head() is 0; "
            f"{a.KEY_LENGTH.format(arch=arch)} is not read) and refuses the attention weights of every layer that has "
            f"them. {FIX[0].upper()}{FIX[1:]}"
        )
    kv_heads = _per_block(h, kv_key) if kv_key in meta else heads
    read = [f"{kv_key}, per block" if isinstance(meta.get(kv_key), list) else kv_key]
    read += [f"{heads_key}, per block"] if isinstance(meta.get(heads_key), list) else []
    read = read if kv_key in meta else [f"{kv_key} absent: {heads_key}, per block"]
    lengths = []
    for k in (a.KEY_LENGTH.format(arch=arch), a.VALUE_LENGTH.format(arch=arch)):
        if k in meta and not _whole(meta[k], 1):
            raise UsageError(
                f"{h.path}: {k} is {_shown(h, k)}; llama.cpp reads one head size, a whole number from 1 to "
                f"{COUNT_LIMIT - 1:,} (32 bits), for every layer (it refuses an array). {FIX[0].upper()}{FIX[1:]}"
            )
        if k in meta:
            lengths.append(meta[k])
            continue
        e_key = gguf.Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)
        embedding = meta.get(e_key)
        if not _whole(embedding, 1) or embedding // heads[0] < 1:
            raise UsageError(
                f"{h.path} sets no {k}, and the default head size llama.cpp takes in its place, {e_key} "
                f"{_shown(h, e_key)} / {heads_key}[0] {heads[0]}, is no whole number of at least 1. {BY_HAND}"
            )
        lengths.append(embedding // heads[0])
        read.append(f"{k} absent: embedding_length / head_count[0]")
    k, v = lengths
    lo, hi = min(kv_heads), max(kv_heads)
    formula = f"kv_heads[layer] {lo if lo == hi else f'{lo}-{hi}'} × (key_length {k} + value_length {v})"
    formula += f" [{'; '.join(read)}]"
    return PerLayerShape(kv_heads=tuple(kv_heads), key_length=k, value_length=v, formula=formula)


def _some_decode(h: GGUFHeader, blocks: int, nextn: int) -> None:
    """Refused (UsageError) where the header's multi-token-prediction blocks (`nextn`, `{arch}.nextn_predict_layers`)
    are all its `blocks`: they are among the blocks, so no layer would decode (check_layers lets as many through,
    which mtp_blocks reads as none)."""
    import gguf

    if nextn >= blocks:
        arch = h.architecture or ""
        raise UsageError(
            f"{h.path}: {gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)} is {nextn}, not fewer than its "
            f"{blocks} blocks ({gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)}): the multi-token-prediction layers are "
            f"among the blocks, so no layer would decode. {FIX[0].upper()}{FIX[1:]}"
        )


COUNT_LIMIT = 2**32  # llama.cpp's hparams are 32-bit: every count and size _whole accepts is below this


def _whole(v: Any, least: int) -> bool:
    """Whether a metadata value is a whole number (not a bool) of at least `least` and below 2^32: llama.cpp reads
    every count and size it builds a layer or a cache by as a 32-bit integer (uint32_t hparams; GGUFMeta's type check
    refuses a 64-bit value), so a larger one is no file it loads, not a figure to price."""
    return isinstance(v, int) and not isinstance(v, bool) and least <= v < COUNT_LIMIT


def check_model(h: GGUFHeader) -> GGUFHeader:
    """`h` is a model llama.cpp loads as one (general.type absent or "model", not the projector architecture), else a
    UsageError naming what the file is and what to pass instead: a LoRA adapter, a multimodal projector and an
    importance matrix are GGUF files too (gguf.GGUFType), which llama.cpp reads beside a model only when asked, and
    as a model stops on with a message about its vocabulary. Scoring, a gguf recipe's source and `quantize cost`
    take a model; `inspect` reads any GGUF. A model's layer counts are checked as llama.cpp checks them
    (check_layers) before anything is sized by them. Returns `h`."""
    import gguf

    kind = h.metadata.get(gguf.Keys.General.TYPE, gguf.GGUFType.MODEL)
    if h.architecture == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ]:
        kind = gguf.GGUFType.MMPROJ
    if kind == gguf.GGUFType.MODEL:
        return check_layers(h)
    what = {
        gguf.GGUFType.ADAPTER: (
            "a LoRA adapter, which llama.cpp applies to a base model only when asked. Merge it into its base model "
            "first (llama.cpp's llama-export-lora) and pass the merged GGUF"
        ),
        gguf.GGUFType.MMPROJ: (
            "a multimodal projector, the vision part run beside a language model. Pass the language model's GGUF"
        ),
        gguf.GGUFType.IMATRIX: (
            "an importance matrix, the statistics a quantizer reads. Pass the model's GGUF (a gguf recipe with "
            "`calibration:` computes its own matrix)"
        ),
    }.get(kind, f"no model (a model's {gguf.Keys.General.TYPE} is {gguf.GGUFType.MODEL!r}). Pass a model's GGUF")
    raise UsageError(f"{h.path} is a GGUF of {gguf.Keys.General.TYPE} {kind!r}, {what}")


def _shown(h: GGUFHeader, key: str) -> str:
    """A metadata value for a message: an array not kept by its item type and length."""
    value = h.metadata.get(key)
    if key in h.arrays and not isinstance(value, list):
        item, n = h.arrays[key]
        return f"an array of {n:,} {item}"
    return str(value)[:80]


def check_layers(h: GGUFHeader) -> GGUFHeader:
    """The counts llama.cpp's load_hparams checks for every architecture, where the header sets them: a block count
    of 1 to LLAMA_MAX_LAYERS (else it aborts), and `{arch}.feed_forward_length`, `attention.head_count` and
    `attention.head_count_kv` given as arrays holding one entry per block (get_key_or_arr refuses another length),
    and no more `{arch}.nextn_predict_layers` (multi-token-prediction blocks, among the blocks) than blocks (else it
    aborts: GGML_ASSERT(n_layer_nextn <= n_layer_all)). A UsageError naming the key otherwise, before the KV cache
    (or anything else sized by a count of layers) is built from them; a header without a block count is left to
    what reads it. Returns `h`."""
    import gguf

    arch = h.architecture
    blocks_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    if arch is None or blocks_key not in h.metadata:
        return h
    blocks = h.metadata[blocks_key]
    if not _whole(blocks, 1) or blocks > LLAMA_MAX_LAYERS:
        raise UsageError(
            f"{h.path}: {blocks_key} is {_shown(h, blocks_key)}; llama.cpp loads a model of 1 to {LLAMA_MAX_LAYERS} "
            f"blocks (its LLAMA_MAX_LAYERS) and aborts on any other count. {FIX[0].upper()}{FIX[1:]}"
        )
    for k in (gguf.Keys.LLM.FEED_FORWARD_LENGTH, gguf.Keys.Attention.HEAD_COUNT, gguf.Keys.Attention.HEAD_COUNT_KV):
        key = k.format(arch=arch)
        if key in h.arrays and (n := h.arrays[key][1]) != blocks:
            raise UsageError(
                f"{h.path}: {key} is {_shown(h, key) if n <= 8 else f'an array of {n:,} entries'}, not one entry per "
                f"block ({blocks_key} {blocks}); llama.cpp refuses a per-layer array of another length. "
                f"{FIX[0].upper()}{FIX[1:]}"
            )
    nextn_key = gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)
    if nextn_key in h.metadata and not (_whole(nextn := h.metadata[nextn_key], 0) and nextn <= blocks):
        raise UsageError(
            f"{h.path}: {nextn_key} is {_shown(h, nextn_key)}, not a count of 0 to its {blocks} blocks ({blocks_key}): "
            "the multi-token-prediction blocks are the last of the blocks, and llama.cpp aborts on more "
            f"(n_layer_nextn <= n_layer_all). {FIX[0].upper()}{FIX[1:]}"
        )
    return h


def context_length(h: GGUFHeader) -> int | None:
    """The context length the header gives its architecture (`{arch}.context_length`), None without one."""
    value = h.metadata.get(f"{h.architecture}.context_length") if h.architecture else None
    return value if _whole(value, 1) else None


# what llama-quantize writes into a GGUF it quantized with an importance matrix (its tools/quantize/quantize.cpp,
# LLM_KV_QUANTIZE_IMATRIX_*: keys of the tool, not of the gguf package or the library); a gguf recipe with
# `calibration:` writes them the same way, and `inspect` reads them from any GGUF
IMATRIX_KEYS = {
    "dataset": "quantize.imatrix.dataset",
    "entries": "quantize.imatrix.entries_count",
    "chunks": "quantize.imatrix.chunks_count",
}


def imatrix_note(h: GGUFHeader) -> str | None:
    """What the header says of the importance matrix it was quantized with (IMATRIX_KEYS), or None."""
    found = {k: h.metadata[v] for k, v in IMATRIX_KEYS.items() if v in h.metadata}
    if not found:
        return None
    said = ", ".join(f"{k} {str(v)[:80]}" for k, v in found.items())
    return f"quantized with an importance matrix (llama-quantize's quantize.imatrix.* keys: {said})"


@dataclass(frozen=True)
class LatentShape:
    """A latent (MLA) KV cache from the header: one latent of kv_lora_rank values shared by the heads plus the
    rope part of the key, and an indexer's keys where DeepSeek sparse attention keeps its own (V3.2)."""

    layers: int  # decode layers: block_count less the multi-token-prediction layers (nextn_predict_layers)
    values: int  # per token and layer
    indexer_keys: int
    formula: str


def latent_shape(h: GGUFHeader) -> LatentShape | None:
    """The MLA cache of a header that sets `{arch}.attention.kv_lora_rank` (DeepSeek V2/V3, Kimi K2 as llama.cpp's
    deepseek2), else None: kv_lora_rank + `{arch}.rope.dimension_count` (the key's rope part, which llama.cpp's
    converter writes from qk_rope_head_dim) values a token, + `{arch}.attention.indexer.key_length` where set, in
    each of `block_count` − `nextn_predict_layers` layers (the multi-token-prediction layers decode nothing), as
    config.json's MLA is priced (checkpoint/architecture.cache_spec). A rank without a rope count, or as many
    multi-token-prediction layers as blocks or more, is refused."""
    import gguf

    arch = h.architecture or ""
    keys, meta = gguf.Keys, h.metadata

    def value(k: str) -> Any:
        v = meta.get(k.format(arch=arch))
        return v if _whole(v, 0) else None

    rank = value(keys.Attention.KV_LORA_RANK)
    if not rank:
        return None
    rope, blocks = value(keys.Rope.DIMENSION_COUNT), value(keys.LLM.BLOCK_COUNT)
    if rope is None or not blocks:
        missing = keys.Rope.DIMENSION_COUNT if rope is None else keys.LLM.BLOCK_COUNT
        raise UsageError(
            f"{h.path} sets {keys.Attention.KV_LORA_RANK.format(arch=arch)} (a latent MLA cache) but not "
            f"{missing.format(arch=arch)}; its KV cache is unknown. Pass --params and --layers/--kv-heads/--head-dim"
        )
    nextn = value(keys.LLM.NEXTN_PREDICT_LAYERS) or 0
    _some_decode(h, blocks, nextn)
    index = value(keys.Attention.Indexer.KEY_LENGTH) or 0
    formula = f"kv_lora_rank {rank} + rope dimension_count {rope}" + (f" + indexer key_length {index}" if index else "")
    formula += f" [{arch}.attention.kv_lora_rank, {arch}.rope.dimension_count"
    formula += f"; {blocks} blocks less {nextn} multi-token-prediction]" if nextn else "]"
    return LatentShape(layers=blocks - nextn, values=rank + rope + index, indexer_keys=index, formula=formula)


@dataclass(frozen=True)
class AttentionShape:
    """What a decode step's KV cache holds per layer, from the GGUF's metadata (gguf.Keys)."""

    layers: int
    kv_heads: int
    key_length: int
    value_length: int
    keys: str  # the metadata keys read, for the cost's formula line


def attention_shape(h: GGUFHeader) -> AttentionShape:
    """Layers, KV heads and head dims from `{arch}.block_count`, `{arch}.attention.head_count(_kv)`,
    `{arch}.attention.key_length`/`value_length` (default: embedding_length / head_count, as llama.cpp defaults
    them). A per-layer head count (per_layer_shape's), a sliding window or a latent (MLA) cache is refused: its KV
    bytes are not one figure per layer."""
    import gguf

    arch = h.architecture
    if arch is None:
        raise UsageError(f"{h.path} has no {gguf.Keys.General.ARCHITECTURE}; its model shape is unknown. {FIX}")
    keys = gguf.Keys

    def key(k: str) -> str:
        return k.format(arch=arch)

    def whole(k: str, default: int | None = None) -> int:
        v = h.metadata.get(key(k), default)
        if not _whole(v, 1):
            got = "is missing" if key(k) not in h.metadata else f"is {str(v)[:40]}"
            raise UsageError(
                f"{h.path}: the metadata key {key(k)} {got}; the KV cache needs it as a whole number from 1 to "
                f"{COUNT_LIMIT - 1:,} (32 bits). "
                f"{BY_HAND}"
            )
        return v

    if unsupported := windowed_or_latent(h):
        raise UsageError(
            f"{h.path} declares {', '.join(unsupported)}: its KV cache (sliding-window or latent attention) is not "
            f"one figure per layer. {BY_HAND}"
        )
    heads = whole(keys.Attention.HEAD_COUNT)
    dims = (keys.Attention.KEY_LENGTH, keys.Attention.VALUE_LENGTH)
    head_dim = None
    if absent := [key(k) for k in dims if key(k) not in h.metadata]:
        embedding = whole(keys.LLM.EMBEDDING_LENGTH)
        head_dim = embedding // heads
        if head_dim < 1:
            raise UsageError(
                f"{h.path} sets no {' / '.join(absent)}, and the default head size llama.cpp takes in its place, "
                f"{key(keys.LLM.EMBEDDING_LENGTH)} {embedding} / {key(keys.Attention.HEAD_COUNT)} {heads}, is 0; the "
                f"KV cache needs a head size of at least 1. {BY_HAND}"
            )
    return AttentionShape(
        layers=whole(keys.LLM.BLOCK_COUNT),
        kv_heads=whole(keys.Attention.HEAD_COUNT_KV, heads),
        key_length=whole(keys.Attention.KEY_LENGTH, head_dim),
        value_length=whole(keys.Attention.VALUE_LENGTH, head_dim),
        keys="; ".join(
            key(k) if key(k) in h.metadata else f"{key(k)} absent: {default}"
            for k, default in (
                (keys.LLM.BLOCK_COUNT, ""),
                (keys.Attention.HEAD_COUNT, ""),
                (keys.Attention.HEAD_COUNT_KV, "head_count"),
                (keys.Attention.KEY_LENGTH, "embedding_length / head_count"),
                (keys.Attention.VALUE_LENGTH, "embedding_length / head_count"),
            )
        ),
    )
