"""Every use of another library's private or internal names, one module per library, each guarded by the versions
it was checked on. A guard that no longer holds is a loud failure in tests/compat/ (and a warning at run time with
the library's own code path kept), never a silent change of what is computed.

`release` and `outside` are the one reading of a version against a module's `CHECKED` range ([from, to))."""

from __future__ import annotations

import re


def release(version: str, parts: int) -> tuple[int, ...]:
    """The first `parts` numbers of a version string, each the digits its part begins with (0 where none or where
    the string has fewer parts): `0.14.0.1` -> (0, 14), `5.17.0.dev0+cu128` -> (5, 17), `1.0rc1` -> (1, 0, 0)."""
    numbers = [int(m.group()) if (m := re.match(r"\d+", p)) else 0 for p in version.split("+")[0].split(".")]
    return tuple((numbers + [0] * parts)[:parts])


def outside(name: str, version: str, checked: tuple[tuple[int, ...], tuple[int, ...]]) -> str | None:
    """Why `version` of library `name` is not one the assumptions were read on (`checked`: [from, to), compared on
    as many parts as `from` has), or None when it is one."""
    lo, hi = checked
    if lo <= release(version, len(lo)) < hi:
        return None
    return f"{name} {version} is outside the checked range {lo}-{hi} (exclusive)"
