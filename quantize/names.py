"""Names a user gives that become one part of a path: a recipe's `name:` (outputs/<name>), a sweep's candidates
(OUTPUT/<name>), a sweep's or search's own name, a golden set's name, version and task names.

One rule for all of them, checked before the name is joined to anything (docs/reliability.md, "Names"):

    text that UTF-8 can encode         a YAML escape like "\\ud800" (a lone surrogate) is not a file name
    NFC-normalised                     two spellings of "é" are one name (the name returned is the NFC one)
    1..100 characters, <= 200 bytes    room for the `.NAME.tmp-PID` and `TASK-NAME.PID.start` built from it
    no '/' or '\\'                     a name is one folder, never a path (`../UP`, `/tmp/x`, `a/`)
    not '.' or '..', no leading '.'    the folder itself, its parent, and hidden names (temporary outputs are
                                       `.NAME.tmp-PID`)
    no control or invisible characters Unicode Cc, Cf, Cs, Co, Zl, Zp: newline, NUL, zero-width and direction marks
    no leading or trailing whitespace

Two names are the same name when their NFC case-folded forms are equal (a case-insensitive file system gives them
one folder): `unique` refuses such a pair, naming both sources. Every refusal is a UsageError (exit 2) naming the
field, the value (shown escaped), and what to do; `PathPart` is the same rule as a pydantic type for schemas, and
`PathText` its counterpart for a whole path a user chooses (`output:`: any parts, not empty, no control character,
no lone surrogate).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Annotated

from pydantic import AfterValidator

from quantize.errors import UsageError

MAX_CHARS = 100
MAX_BYTES = 200  # UTF-8: file systems allow 255 per part, and quantize adds a prefix and suffix to some names
BAD_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "an invisible formatting character",
    "Cs": "a lone surrogate",
    "Co": "a private-use character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}
RULE = (
    f"a name is one folder or file name: 1 to {MAX_CHARS} characters, no '/' or '\\', not starting with '.', "
    "no control characters or spaces at either end"
)


def _escaped(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    if unicodedata.category(c) in BAD_CATEGORIES:
        return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
    return c


def shown(value: object, limit: int = 60) -> str:
    """A value for a message, quoted and bounded, every character that would not print as itself (control,
    invisible, surrogate, separator) escaped as \\uXXXX, so the message shows exactly what was given."""
    if not isinstance(value, str):
        return repr(value)[:limit]
    out = "".join(_escaped(c) for c in value[:limit])
    return f'"{out}"' + ("…" if len(value) > limit else "")


def problem(value: object) -> str | None:
    """Why `value` cannot be one part of a path, or None when it can (module docstring)."""
    if not isinstance(value, str):
        return f"is not text (a {type(value).__name__})"
    if not value:
        return "is empty (it would name the folder it is joined to)"
    if len(value) > 4 * MAX_CHARS:  # bounded work on a huge value
        return f"is {len(value):,} characters long; at most {MAX_CHARS}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"holds U+{ord(value[e.start]):04X}, a lone surrogate (a YAML or JSON escape like \\ud800 that is not a "
            "character): it cannot be written as a file name"
        )
    name = unicodedata.normalize("NFC", value)
    if len(name) > MAX_CHARS or len(name.encode("utf-8")) > MAX_BYTES:
        size = f"{len(name)} characters ({len(name.encode('utf-8'))} bytes in UTF-8)"
        return f"is {size}; at most {MAX_CHARS} characters and {MAX_BYTES} bytes"
    if seps := sorted({c for c in name if c in "/\\"}):
        return f"holds {' and '.join(repr(c) for c in seps)}, a path separator: a name is one folder, not a path"
    if name in (".", ".."):
        return "names a folder itself or its parent, not a new folder"
    if name.startswith("."):
        return "starts with '.' (a hidden name; quantize's temporary outputs are .NAME.tmp-PID)"
    if bad := sorted({c for c in name if unicodedata.category(c) in BAD_CATEGORIES}):
        what = BAD_CATEGORIES[unicodedata.category(bad[0])]
        return f"holds {what} ({', '.join(f'U+{ord(c):04X}' for c in bad[:5])})"
    if name != name.strip():
        return "starts or ends with whitespace"
    return None


def checked(value: object, field: str, fix: str) -> str:
    """`value` as a name (its NFC form), or a UsageError naming `field` and saying `fix`."""
    if (why := problem(value)) is not None:
        raise UsageError(f"{field} = {shown(value)} {why}. {RULE}: {fix}")
    assert isinstance(value, str)
    return unicodedata.normalize("NFC", value)


def _part(value: str) -> str:
    if (why := problem(value)) is not None:
        raise ValueError(f"this name {why}; {RULE}")
    return unicodedata.normalize("NFC", value)


# A schema field that becomes one part of a path: `name: PathPart | None = None`
PathPart = Annotated[str, AfterValidator(_part)]


def path_problem(value: str) -> str | None:
    """Why `value` cannot be a whole path a user chooses for an output (a file system may hold it, but it is no
    path to write to: a newline in a folder's name, or bytes that are not UTF-8, which Python holds as lone
    surrogates and which fail later, where the path is written into a record), or None when it can: the one rule
    for an `output:` field (PathText) and for every output flag (api.OUTPUT: `run --output`, `report --out`, the
    golden commands' outputs, `gate --junit`)."""
    if not value:
        return "is empty: an empty path names no folder; give a folder, e.g. outputs"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"holds U+{ord(value[e.start]):04X}, a lone surrogate (a YAML escape like \\ud800, or a byte that is not "
            "UTF-8 in a command-line argument): it is not a file name"
        )
    if bad := sorted({c for c in value if unicodedata.category(c) == "Cc"}):
        shown_bad = ", ".join(f"U+{ord(c):04X}" for c in bad[:5])
        return f"holds control characters ({shown_bad}), which no folder name should hold"
    return None


def _path(value: str) -> str:
    """A whole path a user writes (an `output:` folder): any parts, but text a file system can hold."""
    if (why := path_problem(value)) is not None:
        raise ValueError(f"this path {why}")
    return value


# A schema field that is a whole path the user chooses (`output:`): not empty, UTF-8, no control characters (NUL)
PathText = Annotated[str, AfterValidator(_path)]


def key(name: str) -> str:
    """What a file system may treat as the same name: NFC, case-folded."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


def unique(named: Iterable[tuple[str, str]], what: str, fix: str) -> None:
    """Refuse two of `named` (name, where it comes from) that are one name (`key`), naming both sources."""
    seen: dict[str, tuple[str, str]] = {}
    for name, source in named:
        k = key(name)
        if k in seen:
            first, where = seen[k]
            same = first == name
            raise UsageError(
                f"two {what} are named {shown(first)}"
                + ("" if same else f" and {shown(name)} (one name on a case-insensitive file system)")
                + f": {where} and {source}. Their outputs would share one folder: {fix}"
            )
        seen[k] = (name, source)
