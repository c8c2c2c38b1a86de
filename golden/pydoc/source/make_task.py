"""Write the demo's lm-eval tasks into DIR: a user's task folder, as a team would have one.

The documents are Python's own help topics (`pydoc_data.topics`, in every CPython install: local text this
machine has, no download). Two tasks read them through `process_docs` (utils.py), which `quantize golden
freeze` runs once and materializes:

    pydoc_cloze   multiple choice: a prose sentence cut before a word; the word or one of three
                  distractors drawn (seeded) from the topics' vocabulary. Clustered by topic.
    pydoc_prose   rolling perplexity over the first 300 words of each topic's prose.

    python golden/pydoc/source/make_task.py DIR
    quantize golden freeze --task pydoc_cloze --task pydoc_prose --include-path DIR \
        --cluster-field topic --out golden/pydoc/v1

The text differs between Python versions; the frozen set pins the one it was made from (its MANIFEST
records the Python version and the data file's sha256).
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main(out: Path) -> None:
    import pydoc_data.topics

    out.mkdir(parents=True, exist_ok=True)
    rows = [{"topic": k, "text": v} for k, v in sorted(pydoc_data.topics.topics.items())]
    (out / "topics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (out / "source.json").write_text(json.dumps({"python": platform.python_version(), "topics": len(rows)}))
    shutil.copy(HERE / "utils.py", out / "utils.py")
    for name in ("pydoc_cloze", "pydoc_prose"):
        text = (HERE / f"{name}.yaml").read_text(encoding="utf-8")
        (out / f"{name}.yaml").write_text(text.replace("TOPICS_JSONL", str((out / "topics.jsonl").resolve())))
    print(f"{out}: {len(rows)} topics from Python {platform.python_version()}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_task.py DIR")
    main(Path(sys.argv[1]))
