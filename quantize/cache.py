"""The cache folder and the rules every entry in it follows: where it is, how an entry is claimed while it is
computed, sealed with a digest after it is written and served only beside a digest it hashes to, and how a memo
is bound to this machine's boot. Nothing here knows what an entry means: the evaluation cache (scores, agreement,
sensitivities, their keys) is quantize/evaluate/cache.py, the weights-hash memo quantize/checkpoint/files.py, the
bf16 probe quantize/convert/dtypes.py, the default model's folder quantize/checkpoint/loader.py.

    $QUANTIZE_CACHE (default ~/.cache/quantize)
        scores/ agreement/ search/   the evaluation cache (quantize/evaluate/cache.py)
        identity/KEY.json            a folder's weights hash      } memos: KEY = sha256(this machine's boot id,
        probe/NAME-KEY.json          a machine measurement        }        what the value depends on)
        models/                      the default model (quantize/checkpoint/loader.py)

A cache may be restored from a store other people write (CI), so a sealed entry is served only when its bytes hash
to the sha256 beside it (`checked_bytes`). A memo is only ever found again on the same machine since its last boot
(`memo_path`): one restored from another machine, or written before a reboot, never matches.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantize import records
from quantize.errors import RuntimeFailure, UsageError
from quantize.io import expand_user, read_user_file, sha256_bytes, sha256_file, sha256_json, write_text_atomic


def cache_dir() -> Path:
    """$QUANTIZE_CACHE, default ~/.cache/quantize: the default model, scores and agreement results. An absolute
    path: a relative one (or a `~` the shell left unexpanded, as in a quoted value) named a different folder from
    every working folder, and `quantize model path` printed it as given (a review)."""
    given = os.environ.get("QUANTIZE_CACHE")
    return expand_user(given, "QUANTIZE_CACHE").absolute() if given else Path.home() / ".cache" / "quantize"


def content_path(folder: str, sha256: str, suffix: str) -> Path:
    """$QUANTIZE_CACHE/FOLDER/SHA256SUFFIX: a copy named by its content's sha256 (golden/manifest.addressed), which
    its user checks against the name before reading it."""
    return cache_dir() / folder / f"{sha256}{suffix}"


def shared_path() -> str:
    """The cache folder as an absolute path: what processes started elsewhere (a sweep's workers) are handed."""
    return str(cache_dir().resolve())


def boot_id() -> str | None:
    """This machine's boot: Linux's random id, new at every boot; None where there is none (no memo is kept)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def memo_path(folder: str, prefix: str, depends: Any) -> Path | None:
    """Where a memo of this boot lives: $QUANTIZE_CACHE/FOLDER/PREFIXsha256(boot id, `depends`).json; None where
    the machine has no boot id (nothing is kept)."""
    boot = boot_id()
    if boot is None:
        return None
    return cache_dir() / folder / f"{prefix}{sha256_json({'boot': boot, **depends})}.json"


SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MEMO_BYTES = 2**20  # a memo is a few lines of JSON


def read_memo(path: Path | None, field: str) -> Any:
    """One field of a memo file, or None where there is none or it does not read (the caller checks the value)."""
    if path is None or not path.exists():
        return None
    try:  # a regular file of at most MEMO_BYTES (a FIFO in its place blocked `quantize cost --hardware local`)
        return json.loads(read_user_file(path, "cache memo", MEMO_BYTES).decode("utf-8")).get(field)
    except (OSError, ValueError, AttributeError, UsageError):
        return None


def write_memo(path: Path | None, data: dict[str, Any]) -> None:
    """Write a memo whole; a cache that cannot be written keeps nothing (the value is computed again next time)."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(data) + "\n")
    except OSError:
        pass


@contextmanager
def claimed(entry: Path) -> Iterator[None]:
    """Hold an exclusive lock on a cache entry while it is computed: a second process scoring the same
    checkpoint waits here, then finds the first one's result instead of scoring again."""
    import fcntl
    import stat

    entry.parent.mkdir(parents=True, exist_ok=True)
    lock = entry.with_name(entry.name + ".lock")
    # never through a link (a restored cache's lock linking elsewhere was truncated), never blocking on a FIFO
    # (open waited for a writer forever), never truncating: flock needs an open file, nothing more
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise UsageError(
                f"cache lock {lock} is a link (a restored cache can hold one); remove it, and the next run makes its "
                "own"
            ) from None
        raise RuntimeFailure(
            f"cannot open the cache lock {lock} ({e.strerror}): the cache folder is not writable here; point "
            "QUANTIZE_CACHE at a folder this process can write"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(
                f"cache lock {lock} is not a regular file (a FIFO or a device); remove it, and the next run makes "
                "its own"
            )
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def digest_path(entry: Path) -> Path:
    """The sha256 file beside a sealed entry: an entry is served only with it."""
    return entry.with_suffix(".sha256")


DIGEST_BYTES = 256  # 64 hex digits and a newline, as `seal` writes them


def read_digest(entry: Path, fix: str, what: str = "file") -> str | None:
    """The sha256 in the digest beside a sealed entry; None where there is none (nor a regular file in its place:
    nothing vouches for the entry). It is read the one safe way (quantize/io.read_user_file: a regular file of at
    most DIGEST_BYTES, opened without blocking) and decoded strictly; anything but one sha256 (64 lowercase
    hexadecimal digits, as `seal` writes it) is a digest changed after it was written: exit 2 naming the entry and
    `fix`, as a digest the entry does not hash to is (bytes 0xff 0xfe in a restored cache's digest were exit 3, a
    UnicodeDecodeError). Its bytes are never shown: a link in its place may name any file."""
    digest = digest_path(entry)
    if not digest.is_file():
        return None
    raw = read_user_file(digest, f"cached {what} {entry}: its digest", DIGEST_BYTES, hint=fix)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        text = ""
    if not SHA256_HEX.fullmatch(text):
        raise UsageError(
            f"cached {what} {entry}: its digest {digest.name} holds no sha256 ({len(raw)} bytes, not 64 lowercase "
            f"hexadecimal digits): it was changed after it was written; {fix}"
        )
    return text


MAX_ENTRY_BYTES = 8 * 2**30  # a score file or comparison is kilobytes to megabytes; a baseline top-k, k values per
# position of the golden set, reaches gigabytes only for sets of millions of tokens


def checked_bytes(entry: Path, fix: str, what: str = "file") -> bytes | None:
    """A cache entry's bytes (a score file, a baseline top-k, a comparison), served only beside a digest they hash
    to: None when the entry or its digest is missing (nothing vouches for it: computed again and replaced), exit 2
    naming the file and `fix` when they differ or the digest holds no sha256 (`read_digest`). The entry is read the
    one safe way (quantize/io.read_user_file: a regular file, checked on the descriptor it is read from, of at most
    MAX_ENTRY_BYTES; anything else in its place is exit 2 naming it and `fix`). The caller parses these bytes, not
    the file again."""
    if not entry.is_file() or (expected := read_digest(entry, fix, what)) is None:
        return None
    raw = read_user_file(entry, f"cached {what}", MAX_ENTRY_BYTES, hint=fix)
    if (found := sha256_bytes(raw)) != expected:
        raise UsageError(
            f"cached {what} {entry} does not hash to the sha256 in {digest_path(entry).name} (sha256 {found}): it "
            f"was changed after it was written; {fix}"
        )
    return raw


def seal(entry: Path) -> None:
    """Write the digest beside an entry just written (after it, so a reader never finds a digest without it)."""
    write_text_atomic(digest_path(entry), sha256_file(entry) + "\n")


def seal_record(p: Path, record: records.Record, replace: bool) -> None:
    """Write a record as a cache entry, then its digest after it. `replace=False`: only where no entry is there
    yet, under the entry's claim (a gate's computed candidate never replaces a file whose sha256 someone may have
    pinned); otherwise the caller holds the claim."""
    if replace:
        write_text_atomic(digest_path(p), records.write(p, record) + "\n")
        return
    with claimed(p):
        if not p.is_file():
            write_text_atomic(digest_path(p), records.write(p, record) + "\n")
