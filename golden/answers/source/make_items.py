"""Write the demo's generation items (JSONL for `quantize golden new --type generate`) from golden/core/v1's
facts: the same questions, answered by greedy generation instead of a choice among four. Each prompt
shows three solved questions of the same kind (seeded, never the item itself) so the answer comes in
the expected form; exact match after stripping and ignoring case.

    python golden/answers/source/make_items.py > /tmp/answers.jsonl
    quantize golden new golden/answers/v1 --from /tmp/answers.jsonl --type generate --task answers_facts
"""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from pathlib import Path

FACTS = Path(__file__).resolve().parents[2] / "core" / "v1" / "data" / "facts.jsonl"
SHOTS, SEED = 3, 1234


def main() -> None:
    items = [json.loads(line) for line in FACTS.read_text(encoding="utf-8").splitlines()]
    by_cluster = defaultdict(list)
    for it in items:
        by_cluster[it["cluster"]].append(it)
    rng = random.Random(SEED)
    for it in items:
        shots = rng.sample([x for x in by_cluster[it["cluster"]] if x["id"] != it["id"]], SHOTS)
        solved = "".join(f"{x['question']} {x['choices'][x['answer']]}\n\n" for x in shots)
        row = {
            "id": it["id"].replace("facts", "answers"),
            "cluster": it["cluster"],
            "prompt": solved + it["question"],
            "answer": it["choices"][it["answer"]],
        }
        sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
