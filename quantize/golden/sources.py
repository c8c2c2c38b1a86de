"""Parsers for the public sources of the golden sets (Debian and PyPI packages; see fetch_sources.sh).

Each parser returns plain, deterministic Python data in file order; builders shuffle with seeds.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from quantize.io import sha256_bytes

JARGON_ENTRY = re.compile(r"^   :(?P<head>.+?):(?P<rest>.*)$")
JARGON_END = "Part III. Appendices"
DEVIL_ENTRY = re.compile(r"^(?P<head>[A-Z][A-Z' .-]*[A-Z]), (?P<pos>[a-z. ]+\.)\s+(?P<rest>.*)$")


def jargon_split(headword: str) -> str:
    """About 80% 'calibration' (text quantizers may see), 20% 'heldout' (evaluation only), by headword hash."""
    return "heldout" if int(sha256_bytes(headword.encode())[:2], 16) >= 0xCC else "calibration"  # first byte


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def jargon_entries(path: Path) -> list[tuple[str, str]]:
    """(headword, text) for every glossary entry of the Jargon File 4.4.7 (jargon.txt.gz)."""
    lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("   :abbrev:"))
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
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8", errors="replace")
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
    for line in path.read_text(encoding="latin-1").splitlines():
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
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(":"):
            section = line[1:].strip()
            out[section] = []
        elif line.strip():
            a, b, c, d = line.split()
            out[section].append((a, b, c, d))
    return out


def wordnet_nouns(path: Path, min_len: int = 4, max_len: int = 7, min_senses: int = 3) -> list[str]:
    """Common single-word nouns from WordNet's index.noun (lemma, synset count >= min_senses)."""
    words = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(" "):
            continue
        parts = line.split()
        lemma, senses = parts[0], int(parts[2])
        if lemma.isalpha() and lemma.islower() and min_len <= len(lemma) <= max_len and senses >= min_senses:
            words.append(lemma)
    return words
