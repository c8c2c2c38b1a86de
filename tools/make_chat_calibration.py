"""Write the shipped chat calibration set, quantize/data/jargon-chat.jsonl, from the Jargon File's calibration split.

Each line is {"id", "headwords", "messages"}: a conversation of one to three user questions about a glossary term,
each answered with that term's entry. The conversations come from templates over text the project already ships
(quantize/data/jargon-calibration.jsonl, public domain), so the set's licence is the Jargon File's and its content
is the built-in text's: a calibration with it differs from `builtin:jargon` in form (turns, the checkpoint's chat
template), not in what it says. Deterministic: the same seed writes the same bytes.

    python tools/make_chat_calibration.py [--seed 0] [--conversations 300]

Held-out items never enter it: only calibration-split entries are used (quantize.golden.sources.jargon_split is
checked again for each), and an entry is left out when any 13 consecutive words of it occur in an item of any
golden set in golden/*/v*/data (the usual contamination test); the counts are printed, and the README beside the
data records them.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from quantize.golden.sources import jargon_split  # noqa: E402

SHINGLE = 13
HEAD = re.compile(r"^\s*(?P<pron>/[^/]*/)?\s*,?\s*(?P<pos>(?:[a-z]+\.\s*,?\s*)+)?\s*(?P<body>.*)$", re.S)
SYSTEM = [
    None,
    None,
    "You are a helpful assistant who explains hacker slang and computing folklore.",
    "You answer questions about the Jargon File, the glossary of hacker slang.",
]
FIRST = [
    "What does “{h}” mean?",
    "I keep seeing the word “{h}” in old mailing lists. What is it?",
    "Can you explain the hacker term {h}?",
    "What is meant by {h} in hacker jargon?",
    "Define {h}, please.",
    "My colleague called something “{h}”. What did she mean?",
    "Where does the term {h} come from, and how is it used?",
]
NEXT = [
    "And what about “{h}”?",
    "Thanks. How about {h}?",
    "Related question: what is {h}?",
    "What does {h} mean, then?",
]
MAX_CHARS = 1200  # an entry longer than this is cut at a sentence end: the set stays under 1 MB


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def shingles(text: str) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + SHINGLE]) for i in range(len(w) - SHINGLE + 1)}


def golden_shingles() -> tuple[set[tuple[str, ...]], list[str]]:
    """Every 13-word run in every string of every golden item (all sets, all versions)."""
    seen: set[tuple[str, ...]] = set()
    files = sorted((ROOT / "golden").glob("*/v*/data/*.jsonl"))

    def walk(v: object) -> None:
        if isinstance(v, str):
            seen.update(shingles(v))
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                walk(json.loads(line))
    return seen, [str(f.relative_to(ROOT)) for f in files]


def answer(head: str, text: str) -> str:
    """The entry as an answer: the headword, its part of speech, its definition (cut at a sentence end)."""
    rest = text[len(head) + 1 :] if text.startswith(head + ":") else text
    m = HEAD.match(rest)
    body = (m["body"] if m else rest).strip()
    pos = (m["pos"] or "").strip().rstrip(",") if m else ""
    if len(body) > MAX_CHARS:
        cut = body.rfind(". ", 0, MAX_CHARS)
        body = body[: cut + 1] if cut > 0 else body[:MAX_CHARS]
    return f"{head} ({pos}) {body}" if pos else f"{head}: {body}"


def build(seed: int, n: int) -> tuple[list[dict], dict[str, int]]:
    entries = [json.loads(line) for line in (ROOT / "quantize" / "data" / "jargon-calibration.jsonl").open()]
    golden, _ = golden_shingles()
    usable, counts = [], {"entries": len(entries), "heldout": 0, "overlapping": 0, "short": 0}
    for e in entries:
        if jargon_split(e["headword"]) != "calibration":
            counts["heldout"] += 1
        elif shingles(e["text"]) & golden:
            counts["overlapping"] += 1
        elif len(e["text"]) < 120:
            counts["short"] += 1
        else:
            usable.append(e)
    rng = random.Random(seed)
    rng.shuffle(usable)
    out, i = [], 0
    for c in range(n):
        turns = rng.choice([1, 1, 2, 2, 3])
        picked = usable[i : i + turns]
        i += turns
        if len(picked) < turns:
            raise SystemExit(f"only {len(usable)} usable entries; ask for fewer conversations")
        messages = []
        if (system := rng.choice(SYSTEM)) is not None:
            messages.append({"role": "system", "content": system})
        for t, e in enumerate(picked):
            q = rng.choice(FIRST if t == 0 else NEXT).format(h=e["headword"])
            messages += [
                {"role": "user", "content": q},
                {"role": "assistant", "content": answer(e["headword"], e["text"])},
            ]
        out.append({"id": f"jargon-chat-{c:04d}", "headwords": [e["headword"] for e in picked], "messages": messages})
    counts["usable"] = len(usable)
    counts["used"] = i
    return out, counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--conversations", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "quantize" / "data" / "jargon-chat.jsonl"))
    args = ap.parse_args()
    rows, counts = build(args.seed, args.conversations)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    Path(args.out).write_text(text, encoding="utf-8")
    print(json.dumps({**counts, "conversations": len(rows), "bytes": len(text.encode())}))


if __name__ == "__main__":
    main()
