"""Extract the Jargon File 4.4.7 glossary (public domain) into the text the project ships.

Source: Debian package `jargon-text` (file /usr/share/doc/jargon-text/jargon.txt.gz).
Run once by a maintainer; the output is committed, so neither quantization nor
evaluation needs the package:

    apt-get download jargon-text && dpkg -x jargon-text_*.deb /tmp/jargon
    python tools/extract_jargon.py /tmp/jargon/usr/share/doc/jargon-text/jargon.txt.gz

Each glossary entry becomes one JSON line {"id", "headword", "text"}, in
quantize/data/jargon-calibration.jsonl or jargon-heldout.jsonl by a hash of its
headword (quantize.golden.sources.jargon_split): about 80% is text the quantizers
see, the rest is used only to measure, never to calibrate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from quantize.golden.sources import jargon_entries, jargon_split  # noqa: E402


def main(path: str) -> None:
    out = ROOT / "quantize" / "data"
    files = {name: (out / f"jargon-{name}.jsonl").open("w", encoding="utf-8") for name in ("calibration", "heldout")}
    for i, (head, text) in enumerate(jargon_entries(Path(path))):
        record = {"id": f"jargon-{i:04d}", "headword": head, "text": text}
        files[jargon_split(head)].write(json.dumps(record, ensure_ascii=False) + "\n")
    for f in files.values():
        f.close()


if __name__ == "__main__":
    main(sys.argv[1])
