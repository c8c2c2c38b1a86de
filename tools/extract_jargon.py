"""Extract the Jargon File 4.4.7 glossary (public domain) into the text the project ships.

Source: Debian package `jargon-text` (file /usr/share/doc/jargon-text/jargon.txt.gz).
Run once by a maintainer; the output is committed, so neither quantization nor
evaluation needs the package:

    apt-get download jargon-text && dpkg -x jargon-text_*.deb /tmp/jargon
    python tools/extract_jargon.py /tmp/jargon/usr/share/doc/jargon-text/jargon.txt.gz

Each glossary entry becomes one JSON line {"id", "headword", "text"}. Entries are
split by a hash of their headword, so the split never depends on file order:
about 80% go to `calibration` (text the quantizers see), the rest to `heldout`
(text used only to measure perplexity, never to calibrate).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sys
from pathlib import Path

ENTRY = re.compile(r"^   :(?P<head>.+?):(?P<rest>.*)$")
END_MARKER = "Part III. Appendices"
OUT = Path(__file__).resolve().parent.parent / "quantize" / "data"


def split_of(headword: str) -> str:
    return "heldout" if hashlib.sha256(headword.encode()).digest()[0] >= 0xCC else "calibration"


def entries(lines: list[str]) -> list[tuple[str, str]]:
    start = next(i for i, line in enumerate(lines) if line.startswith("   :abbrev:"))
    out: list[tuple[str, list[str]]] = []
    for line in lines[start:]:
        if line.strip() == END_MARKER:
            break
        m = ENTRY.match(line)
        if m:
            out.append((m["head"], [f"{m['head']}:{m['rest']}"]))
        elif out:
            out[-1][1].append(line.strip())
    cleaned = []
    for head, body in out:
        paragraphs = " ".join(body).replace("{", "").replace("}", "")
        text = re.sub(r"\s+", " ", paragraphs).strip()
        cleaned.append((head, text))
    return cleaned


def main(path: str) -> None:
    lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
    files = {name: (OUT / f"jargon-{name}.jsonl").open("w", encoding="utf-8") for name in ("calibration", "heldout")}
    for i, (head, text) in enumerate(entries(lines)):
        record = {"id": f"jargon-{i:04d}", "headword": head, "text": text}
        files[split_of(head)].write(json.dumps(record, ensure_ascii=False) + "\n")
    for f in files.values():
        f.close()


if __name__ == "__main__":
    main(sys.argv[1])
