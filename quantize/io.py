"""Atomic outputs, hashing and reading what a user names: the one place that writes folders and files into
place, the one place that hashes bytes and JSON, and the one way to read a file a user (or a checkpoint) names.

An output folder is written into a hidden temporary folder beside the target, then renamed: an
interrupted run leaves at most a `.NAME.tmp-PID` folder, never a folder at the target path that
looks complete. Leftovers are found by their exact names (never a pattern built from the output's
name), links among them are never followed, removed or restored.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from quantize.errors import RuntimeFailure, UsageError

FULL = {errno.ENOSPC, errno.EDQUOT}  # a full disk, or a full quota


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where the system
    cannot, so the caller falls back to two renames."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # file system or kernel without exchange
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextmanager
def atomic_dir(target: Path, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `target`; on success rename it to `target`.

    With replace=True an existing target is exchanged with the new folder in one atomic step, then
    the old one (now under the temporary name) is deleted: at every moment the target path holds a
    complete folder. Where the exchange is not available, the old target is moved aside
    (`.NAME.old-PID`) first; a kill between the two renames is repaired by `recover`."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        plain_modes(tmp)
        if target.exists() and not replace:
            raise UsageError(
                f"{target} appeared while this run was writing (another run finished it first); this run's result "
                "was discarded. Use the other run's output, or run again (with --force, where the command has it) "
                "to replace it"
            )
        if not (target.exists() and _exchange(tmp, target)):  # after an exchange tmp holds the old output
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            if target.exists():
                target.rename(old)
            tmp.rename(target)
            _remove(old)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in FULL:
            raise RuntimeFailure(
                f"no space left on the device writing {target} (the partial output {tmp.name} was removed): free "
                f"space on {target.parent} and run again"
            ) from e
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _remove(tmp)  # after an exchange: the old output, which may have been a link (removed as a link, never followed)


def _remove(p: Path) -> None:
    """Remove what a replace left under our own temporary name: a link as a link (rmtree refuses one, and the link
    was left behind as `.NAME.tmp-PID`), a folder whole."""
    if p.is_symlink():
        p.unlink()
    else:
        shutil.rmtree(p, ignore_errors=True)


def plain_modes(folder: Path) -> None:
    """Give each regular file in `folder` (and its subfolders, links not followed) the mode a plain open() gives
    under this process's umask (0644 under the usual 022): safetensors' writer creates its files 0600, so a
    published checkpoint's weights were unreadable to every other user while its config was not."""
    want = 0o666 & ~_umask()
    for root, _dirs, files in os.walk(folder):
        for name in files:
            f = os.path.join(root, name)
            st = os.lstat(f)
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != want:
                os.chmod(f, want)


def _umask() -> int:
    """This process's umask, read where Linux shows it (/proc/self/status) rather than set and put back, which
    another thread creating a file in between would get wrong."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(target: Path) -> list[Path]:
    """Folders that killed runs left beside `target`: `.NAME.tmp-PID` (an unfinished output), `.NAME.old-PID` (a
    replaced output not yet removed) and `.NAME.offload-PID` (an offloaded conversion's weights), of processes no
    longer running. Matched by exact name (the prefix, then digits only); a link of that name is not a leftover of
    ours and is never listed."""
    target = Path(target)
    if not target.parent.is_dir():
        return []
    prefixes = [f".{target.name}.{kind}-" for kind in ("tmp", "old", "offload")]
    found = []
    with os.scandir(target.parent) as entries:
        for e in entries:
            for prefix in prefixes:
                pid = e.name[len(prefix) :] if e.name.startswith(prefix) else ""
                if pid.isdigit() and e.is_dir(follow_symlinks=False) and not _pid_alive(int(pid)):
                    found.append(Path(e.path))
    return sorted(found)


def recover(target: Path, complete: Callable[[Path], bool]) -> Path | None:
    """If a replace was cut between its two renames (target gone, `.NAME.old-PID` left), put the old output
    back at the target, but only a folder `complete` accepts (the caller knows what a whole output is).
    Returns the folder restored, or None."""
    target = Path(target)
    if target.exists() or target.is_symlink():
        return None
    old = [p for p in leftovers(target) if p.name.startswith(f".{target.name}.old-") and complete(p)]
    if not old:
        return None
    newest = max(old, key=lambda p: p.stat(follow_symlinks=False).st_mtime)
    newest.rename(target)
    return newest


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (same suffix, for writers that insist on one); on success
    it replaces `path` in one rename, on failure it is removed. The temporary file is created here, exclusively and
    under a name no one can guess (mkstemp), before any writer opens it: a predictable `.NAME.tmp-PID` name let a
    link planted under it in a folder others can write (a checkpoint's, beside its README.md) turn the write into
    one through the link, to any file the user can write (a review). It gets the mode a plain open() gives."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.tmp-{os.getpid()}-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if stat.S_ISREG(os.lstat(tmp).st_mode):  # mkstemp's 0600 -> what open() would give; a link is never followed
            os.chmod(tmp, 0o666 & ~_umask())
        tmp.replace(path)
    except OSError as e:
        if e.errno in FULL:
            raise RuntimeFailure(f"no space left on the device writing {path}: free space there and run again") from e
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def unwritable_parent(path: Path) -> Path | None:
    """The first existing folder above `path` where it is no folder this process can create entries in (a file,
    or a folder without write and search permission); None where `path` can be made there. What an output check
    names before any work (a conversion's `output:`, a search's, the report's `--out`)."""
    for parent in Path(path).absolute().parents:
        if parent.exists():
            return None if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK) else parent
    return None


def check_writable(path: Path, what: str) -> None:
    """Before any work: a file can be written at `path` (its folder exists and is writable, the path is no
    folder); else a UsageError naming `what` (the flag) and the path."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"{what} {path} is a folder; give a file path")
    if not parent.is_dir():
        raise UsageError(f"{what} {path}: the folder {parent} does not exist; create it, or give another path")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{what} {path} cannot be written (permissions); give another path")


def check_output_file(
    path: Path,
    what: str,
    ours: Callable[[bytes], bool],
    kind: str,
    apart: Iterable[tuple[str, Path]] = (),
) -> None:
    """Before any work: `path` can take a file this command writes, and writing it there loses nothing. The rule
    `report --out` keeps for its folder (report/render.check_target: an existing target is replaced only where it
    is recognisably the command's own), for one file: it is no link (the rename would replace the link, which was
    named for what it points to); it lies inside (or is) none of `apart`, (what, path) pairs such as the checkpoints
    compared and the golden set, links resolved (a JUnit file named CANDIDATE/model.safetensors replaced the
    candidate's weights); check_writable holds; and where it exists it is a regular file of at most 64 MiB that
    `ours` recognises from its bytes as `kind`, a file this command wrote before (read without following a link).
    Anything else (weights, a policy, another tool's report) is never replaced. Each refusal is a UsageError naming
    `what` (the flag), the path and what to do."""
    path = Path(path)
    if path.is_symlink():
        raise UsageError(f"{what} {path} is a symbolic link, which is never written through; name a new file")
    check_writable(path, what)
    try:
        where = path.parent.resolve() / path.name
    except (OSError, RuntimeError):  # a link loop above it: check_writable found its folder; nothing to compare
        where = None
    for name, p in apart:
        try:
            folder = Path(p).resolve()
        except (OSError, RuntimeError):
            continue
        if where is not None and (where == folder or where.is_relative_to(folder)):
            raise UsageError(
                f"{what} {path} is {'' if where == folder else 'inside '}{name} {p}, which this command only reads; "
                "name a path outside it"
            )
    if not (path.exists() or path.is_symlink()):
        return
    try:
        raw: bytes | None = read_user_file(path, what, 64 * 2**20, follow_links=False)
    except UsageError:  # larger than any output of ours, a pipe, unreadable: not a file this command wrote
        raw = None
    if raw is None or not ours(raw):
        raise UsageError(
            f"{what} {path} exists and is not {kind}, the only file replaced there; name a new path, or move that "
            "file away first"
        )


def sha256_json(data: Any) -> str:
    """sha256 of JSON with sorted keys: the hash of a settings mapping or a cache key's parts."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def sha256_named(named: Iterable[tuple[str, str]]) -> str:
    """sha256 of one "NAME SHA256" line per (name, digest) pair, in the order given: the hash of a set of files (a
    checkpoint's weights, an lm-eval run's samples, llama.cpp's native libraries)."""
    return sha256_bytes("".join(f"{name} {sha}\n" for name, sha in named).encode())


@contextmanager
def open_user_file(
    path: str | Path, what: str, max_bytes: int, *, follow_links: bool = True, hint: str = "", too_big: str = ""
) -> Iterator[BinaryIO]:
    """A file a user (or a checkpoint) names, opened the one safe way (`read_user_file` says which); yields the open
    binary file for a reader that streams it (`UserLines`). Only the size on opening is checked here: a reader
    that streams stops at `max_bytes` itself. `hint` ends every refusal, `too_big` only the one of a file too
    large (what to do with a large file says nothing to one who named a FIFO)."""
    p = Path(path)
    tail = f"; {hint}" if hint else ""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise UsageError(f"{what} {p} does not exist{tail}") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {p} is a folder, not a file{tail}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(
                f"{what} {p} is a symbolic link, which is never followed here; put the file itself there{tail}"
            ) from None
        raise UsageError(f"{what} {p} cannot be read ({e.strerror}){tail}") from None
    except ValueError:  # a NUL byte in the name: no file has it
        raise UsageError(f"{what} {str(p)[:200]!r} names no file (it holds a NUL byte){tail}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{what} {p} is a folder, not a file{tail}")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {p} is not a regular file (a pipe, a device or a socket); give a file{tail}")
        big = f"; {too_big}" if too_big else ""
        raise UsageError(f"{what} {p} is {st.st_size:,} bytes; at most {max_bytes:,} are read here{tail}{big}")
    with os.fdopen(fd, "rb", buffering=2**20) as fh:  # 1 MiB: a large JSONL is read by line twice as fast
        yield fh


def read_user_file(
    path: str | Path, what: str, max_bytes: int, *, follow_links: bool = True, hint: str = "", too_big: str = ""
) -> bytes:
    """The bytes of a file a user (or a checkpoint) names, read the one safe way: it must be a regular file (a
    FIFO, a device, a socket or a folder is refused without being read: reading a FIFO blocks, /dev/zero never
    ends), at most `max_bytes` long (checked on the open file before reading, and again while reading, so a file
    that grows is cut off), and with `follow_links=False` not a symbolic link itself (O_NOFOLLOW: a README linked to
    /proc/self/environ is refused, never read). The file is opened non-blocking and checked with fstat on the
    same descriptor, so nothing can be swapped in between the check and the read.
    Every refusal is a UsageError naming `what`, the path and what to do (`hint`; `too_big` for a file too large)."""
    with open_user_file(path, what, max_bytes, follow_links=follow_links, hint=hint, too_big=too_big) as fh:
        # the size it has, plus one byte to see it grew (a read of max_bytes would allocate max_bytes), then the rest
        parts = [fh.read(os.fstat(fh.fileno()).st_size + 1)]
        size = len(parts[0])
        while size <= max_bytes and (more := fh.read(min(2**20, max_bytes + 1 - size))):
            parts.append(more)
            size += len(more)
        raw = b"".join(parts)
    if len(raw) > max_bytes:
        tail = "".join(f"; {h}" for h in (hint, too_big) if h)
        raise UsageError(f"{what} {path} is more than {max_bytes:,} bytes; at most {max_bytes:,} are read here{tail}")
    return raw


def sha256_user_file(path: str | Path, what: str, max_bytes: int, *, follow_links: bool = True, hint: str = "") -> str:
    """The sha256 of a file a user names, opened the one safe way (`open_user_file`) and streamed: memory does
    not grow with the file (a file that grows past `max_bytes` while hashed is refused)."""
    h, size = hashlib.sha256(), 0
    with open_user_file(path, what, max_bytes, follow_links=follow_links, hint=hint) as fh:
        while chunk := fh.read(2**20):
            size += len(chunk)
            if size > max_bytes:
                raise UsageError(f"{what} {path} is more than {max_bytes:,} bytes; at most {max_bytes:,} are read here")
            h.update(chunk)
    return h.hexdigest()


class UserLines:
    """The lines of an open file, one at a time, with the sha256 of every byte read: a large JSONL is hashed and
    checked in one pass, in memory bounded by `max_line` (never the file's size). Iterating yields (line number
    from 1, the line's bytes without its newline); a line over `max_line` bytes, or more than `max_bytes` in all,
    is a UsageError naming `origin` and the line. After the loop `newlines` counts the newline bytes (a manifest's
    item count) and `hexdigest()` is the file's sha256."""

    def __init__(self, fh: BinaryIO, origin: str, max_bytes: int, max_line: int) -> None:
        self._fh, self.origin, self.max_bytes, self.max_line = fh, origin, max_bytes, max_line
        self._hash = hashlib.sha256()
        self.newlines = 0
        self.size = 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        n = 0
        while line := self._line(n + 1):
            n += 1
            self.newlines += line.endswith(b"\n")
            yield n, line[:-1] if line.endswith(b"\n") else line

    def _line(self, n: int) -> bytes:
        """The next line with its newline, read in pieces (readline with a large limit allocates the limit)."""
        parts: list[bytes] = []
        size = 0
        while piece := self._fh.readline(2**16):
            self._hash.update(piece)
            self.size += len(piece)
            parts.append(piece)
            size += len(piece)
            if size - piece.endswith(b"\n") > self.max_line:
                raise UsageError(
                    f"{self.origin} line {n} is over the {self.max_line:,}-byte limit per line; shorten it (one item "
                    "per line)"
                )
            if self.size > self.max_bytes:
                raise UsageError(f"{self.origin} is more than {self.max_bytes:,} bytes; at most that is read here")
            if piece.endswith(b"\n"):
                break
        return b"".join(parts)

    def text(self, n: int, body: bytes) -> str:
        """Line `n` as UTF-8, strictly: a bad byte is a UsageError naming the line and column."""
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(
                f"{self.origin} line {n} is not UTF-8 text: byte 0x{body[e.start]:02x} at column {e.start + 1}; save "
                "the file as UTF-8"
            ) from None

    def drain(self) -> None:
        """Read the rest (hashing it) without looking at its lines."""
        for _ in self:
            pass

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


@contextmanager
def user_lines(
    path: str | Path,
    what: str,
    max_bytes: int,
    max_line: int,
    *,
    follow_links: bool = True,
    hint: str = "",
    too_big: str = "",
) -> Iterator[UserLines]:
    """`open_user_file`, read as `UserLines` (origin: `what` and the path)."""
    with open_user_file(path, what, max_bytes, follow_links=follow_links, hint=hint, too_big=too_big) as fh:
        yield UserLines(fh, f"{what} {path}", max_bytes, max_line)


def decode_text(raw: bytes, origin: str) -> str:
    """Bytes as UTF-8, strictly: a byte that is not UTF-8 (or a lone surrogate's encoding) is a UsageError naming
    `origin` with the line and column of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise UsageError(
            f"{origin} is not UTF-8 text: byte 0x{raw[e.start]:02x} at line {line}, column {column} (byte offset "
            f"{e.start}); save the file as UTF-8"
        ) from None


def expand_user(path: str | Path, field: str) -> Path:
    """`path` with a leading ~ or ~USER made that home folder (Path.expanduser). One naming a user this machine
    does not have (or ~ with no home folder known) is a UsageError naming `field`: expanduser's RuntimeError was
    exit 3."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        head = str(path).split("/", 1)[0]
        raise UsageError(
            f"{field} = {str(path)!r}: {head} names no home folder on this machine (no such user, or no HOME); "
            "give the path without ~, or ~/... for your own home folder"
        ) from None


def read_user_text(
    path: str | Path, what: str, max_bytes: int, *, follow_links: bool = True, hint: str = "", too_big: str = ""
) -> str:
    """`read_user_file`, then `decode_text`: the text of a file a user names, strictly decoded."""
    raw = read_user_file(path, what, max_bytes, follow_links=follow_links, hint=hint, too_big=too_big)
    return decode_text(raw, f"{what} {path}")
