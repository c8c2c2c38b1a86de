"""process_docs of the demo tasks: run once by `quantize golden freeze`, never by the frozen set."""

import hashlib
import random
import re

MIN_WORDS, MAX_WORDS, PER_TOPIC, PROSE_WORDS = 8, 40, 12, 300


def prose(text: str) -> list[str]:
    """Paragraphs of running text: no headings, underlines, code or grammar blocks (indented)."""
    paras, cur = [], []
    for line in text.splitlines():
        if not line.strip() or line.startswith(" ") or re.fullmatch(r"[*=\-~^]+", line.strip()):
            if cur:
                paras.append(" ".join(cur))
            cur = []
        else:
            cur.append(line.strip())
    if cur:
        paras.append(" ".join(cur))
    return [p for p in paras if len(p.split()) >= MIN_WORDS]


def _rng(*key: str) -> random.Random:
    return random.Random(hashlib.sha256("\x00".join(key).encode()).hexdigest())


def cloze(dataset):
    import datasets

    docs = list(dataset)
    vocab = sorted({w for d in docs for p in prose(d["text"]) for w in re.findall(r"\b[a-z]{4,12}\b", p)})
    out = []
    for d in docs:
        sentences = [
            s
            for p in prose(d["text"])
            for s in re.split(r"(?<=[.!?])\s+", p)
            if MIN_WORDS <= len(s.split()) <= MAX_WORDS
        ]
        for s in _rng(d["topic"], "pick").sample(sentences, min(PER_TOPIC, len(sentences))):
            words = s.split()
            spots = [i for i, w in enumerate(words) if i >= 4 and re.fullmatch(r"[a-z]{4,12}", w)]
            if not spots:
                continue
            i = _rng(s, "spot").choice(spots)
            r = _rng(s, "distractors")
            wrong = []
            while len(wrong) < 3:
                w = r.choice(vocab)
                if w != words[i] and w not in wrong:
                    wrong.append(w)
            choices = sorted([words[i], *wrong], key=lambda w: _rng(s, w).random())
            context = f"From Python's help on {d['topic']}:\n" + " ".join(words[:i])
            out.append({"topic": d["topic"], "context": context, "choices": choices, "answer": choices.index(words[i])})
    return datasets.Dataset.from_list(out)


def first_prose(dataset):
    import datasets

    out = []
    for d in dataset:
        words = " ".join(prose(d["text"])).split()
        if len(words) >= 100:
            out.append({"topic": d["topic"], "text": " ".join(words[:PROSE_WORDS])})
    return datasets.Dataset.from_list(out)
