"""Parsers for the public sources of the golden sets (Debian and PyPI packages; see fetch_sources.sh).

Each parser returns plain, deterministic Python data in file order; builders shuffle with seeds.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

from quantize.errors import UsageError
from quantize.io import decode_text, read_user_file, sha256_bytes

# each source file is read the one safe way (quantize/io.py): a regular file of at most MAX_SOURCE_BYTES (the
# largest, WordNet's index.noun, is ~4 MB), decompressed to at most MAX_TEXT_BYTES
MAX_SOURCE_BYTES = 64 * 2**20
MAX_TEXT_BYTES = 256 * 2**20
HINT = "fetch the sources again (golden/core/fetch_sources.sh)"

JARGON_ENTRY = re.compile(r"^   :(?P<head>.+?):(?P<rest>.*)$")
JARGON_END = "Part III. Appendices"
DEVIL_ENTRY = re.compile(r"^(?P<head>[A-Z][A-Z' .-]*[A-Z]), (?P<pos>[a-z. ]+\.)\s+(?P<rest>.*)$")


def jargon_split(headword: str) -> str:
    """About 80% 'calibration' (text quantizers may see), 20% 'heldout' (evaluation only), by headword hash."""
    return "heldout" if int(sha256_bytes(headword.encode())[:2], 16) >= 0xCC else "calibration"  # first byte


def _read(path: Path) -> bytes:
    """A source file's bytes, gunzipped when gzip (a .gz, or dictd's .dz, which is gzip), at most MAX_TEXT_BYTES."""
    raw = read_user_file(path, "golden source file", MAX_SOURCE_BYTES, hint=HINT)
    if raw[:2] != b"\x1f\x8b":
        return raw
    out = b""
    while raw:  # member after member, as gzip.open reads them
        d = zlib.decompressobj(wbits=31)  # 31: a gzip header
        try:
            out += d.decompress(raw, MAX_TEXT_BYTES - len(out) + 1)
        except zlib.error as e:
            raise UsageError(f"golden source file {path} is not valid gzip ({e}); {HINT}") from None
        if d.unconsumed_tail or len(out) > MAX_TEXT_BYTES:
            raise UsageError(f"golden source file {path} unpacks to over {MAX_TEXT_BYTES:,} bytes; {HINT}")
        raw = d.unused_data
    return out


def _text(path: Path) -> str:
    return decode_text(_read(path), f"golden source file {path}")


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def jargon_entries(path: Path) -> list[tuple[str, str]]:
    """(headword, text) for every glossary entry of the Jargon File 4.4.7 (jargon.txt.gz)."""
    lines = _text(path).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("   :abbrev:")), None)
    if start is None:
        raise UsageError(f"golden source file {path} has no `   :abbrev:` entry: it is not the Jargon File; {HINT}")
    out: list[tuple[str, list[str]]] = []
    for line in lines[start:]:
        if line.strip() == JARGON_END:
            break
        m = JARGON_ENTRY.match(line)
        if m:
            out.append((m["head"], [f"{m['head']}:{m['rest']}"]))
        elif out:
            out[-1][1].append(line.strip())
    return [(head, _clean(" ".join(body).replace("{", "").replace("}", ""))) for head, body in out]


def devil_entries(path: Path) -> list[tuple[str, str]]:
    """(headword, definition prose) from The Devil's Dictionary (dictd devil.dict.dz); verse quotations dropped."""
    text = _read(path).decode("utf-8", errors="replace")  # as the built core/v1 and v2 read it
    out: list[tuple[str, list[str]]] = []
    in_verse = False
    for line in text.splitlines():
        m = DEVIL_ENTRY.match(line)
        if m:
            out.append((m["head"].title(), [m["rest"]]))
            in_verse = False
        elif out:
            if line.startswith("    ") or (in_verse and line.strip()):
                in_verse = True  # indented verse and attributions are quotations, not Bierce's definition
            elif not line.strip():
                in_verse = False if not out[-1][1] else in_verse
            elif not in_verse:
                out[-1][1].append(line.strip())
    return [(head, _clean(" ".join(body).replace("_", ""))) for head, body in out if body]


def _split_top(field: str) -> list[str]:
    """Split bsd-games quiz syntax on the '|' that stand outside {} and []."""
    depth, parts, cur = 0, [], []
    for ch in field:
        depth += (ch in "{[") - (ch in "}]")
        if ch == "|" and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    return parts + ["".join(cur)]


def _expand(field: str) -> str:
    """bsd-games quiz syntax -> one canonical answer: first of a|b, optional {x} kept, [a|b] -> a."""
    s = _split_top(field)[0]
    while m := re.search(r"[\[{]([^\[\]{}]*)[\]}]", s):
        s = s[: m.start()] + _split_top(m.group(1))[0] + s[m.end() :]
    return _clean(s)


def _alternatives(field: str) -> set[str]:
    """All top-level alternatives of a field, each expanded: used to keep distractors from being right."""
    return {_expand(p).lower() for p in _split_top(field)}


def quiz_rows(path: Path) -> list[list[tuple[str, set[str]]]]:
    """Rows of a bsd-games quiz file: per field, (canonical answer, every accepted answer, lower-cased)."""
    rows = []
    for line in _read(path).decode("latin-1").splitlines():
        line = re.sub(r".\x08", "", line).replace("\\:", "\x00")  # drop overstruck accents: Bogot'\ba -> Bogota
        if not line.strip() or line.startswith("#"):
            continue
        fields = [f.replace("\x00", ":") for f in line.split(":")]
        rows.append([(_expand(f), _alternatives(f)) for f in fields])
    return rows


def analogies(path: Path) -> dict[str, list[tuple[str, str, str, str]]]:
    """Mikolov et al.'s word analogies by section: a : b :: c : d."""
    out: dict[str, list[tuple[str, str, str, str]]] = {}
    section = ""
    for n, line in enumerate(_text(path).splitlines(), 1):
        if line.startswith(":"):
            section = line[1:].strip()
            out[section] = []
        elif line.strip():
            if len(words := line.split()) != 4 or section not in out:
                raise UsageError(
                    f"golden source file {path} line {n}: {line[:80]!r} is not four words of an analogy under a "
                    f"`: section` line; {HINT}"
                )
            out[section].append((words[0], words[1], words[2], words[3]))
    return out


def wordnet_nouns(path: Path, min_len: int = 4, max_len: int = 7, min_senses: int = 3) -> list[str]:
    """Common single-word nouns from WordNet's index.noun (lemma, synset count >= min_senses)."""
    words = []
    for n, line in enumerate(_text(path).splitlines(), 1):
        if line.startswith(" "):
            continue
        parts = line.split()
        if len(parts) < 3 or not parts[2].isdigit():
            raise UsageError(
                f"golden source file {path} line {n}: {line[:80]!r} is not an index.noun line (lemma, part of "
                f"speech, synset count, ...); {HINT}"
            )
        lemma, senses = parts[0], int(parts[2])
        if lemma.isalpha() and lemma.islower() and min_len <= len(lemma) <= max_len and senses >= min_senses:
            words.append(lemma)
    return words
