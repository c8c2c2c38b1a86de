"""Write golden/std's source into DIR: local parquet in the shape of four hub datasets, and a task folder whose
YAMLs are lm-eval's own task definitions with only the dataset pointed at those files (the parquet route).

    arc_easy        (allenai/ai2_arc's shape) which built-in, standard-library module or HTTP status a line of
                    Python's own documentation describes; 4 choices of the same kind, acc and acc_norm.
    hellaswag       (Rowan/hellaswag's shape, through lm-eval's own process_docs) a sentence of Python's help
                    topics cut after half its words, its true ending among 3 endings of other sentences.
    gsm8k           (openai/gsm8k's shape) grade-school arithmetic word problems this script writes, with
                    worked answers ending "#### N"; lm-eval's 5-shot task and both regex filter pipelines.
    lambada_openai  (EleutherAI/lambada_openai's shape) passages of the help topics, the last word predicted.

Every text is local and openly licensed: Python's documentation and standard library (`pydoc_data.topics`,
docstrings read with `ast` from the standard library's sources, `http.HTTPStatus`; PSF License 2.0), and the
arithmetic problems, which this script composes (seeded). The text differs between Python versions: the frozen
set pins the one it was made from (its MANIFEST records the Python version and each file's sha256).

    python golden/std/source/make_data.py DIR
    quantize golden freeze --task arc_easy --task hellaswag --task gsm8k --task lambada_openai \
        --include-path DIR/tasks --out golden/std/v1
"""

from __future__ import annotations

import ast
import json
import platform
import random
import re
import sys
import sysconfig
from pathlib import Path

SEED = 2026
WORD = re.compile(r"^[A-Za-z]+$")
CODE = re.compile(r"[*_`|<>{}\[\]=\\]|\.\.\.|::|e\.g|i\.e|etc\.")  # markup, code, abbreviations that split badly


def _sentences() -> list[tuple[str, str]]:
    """(topic, sentence) of the help topics' prose: lines of plain words, no code, 12 to 40 words."""
    import pydoc_data.topics

    out = []
    for topic, text in sorted(pydoc_data.topics.topics.items()):
        prose = " ".join(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("   ", "\t")))
        for s in re.split(r"(?<=[.!?])\s+", prose):
            words = s.split()
            if 12 <= len(words) <= 40 and not CODE.search(s) and s[0].isupper():
                out.append((topic, s))
    return out


def _described() -> list[tuple[str, str, str]]:
    """(source, name, first line of its documentation) for built-ins, public modules and HTTP statuses."""
    import builtins
    from http import HTTPStatus

    out = []
    for n in sorted(dir(builtins)):
        doc = (getattr(getattr(builtins, n), "__doc__", None) or "").strip()
        line = doc.splitlines()[0] if doc else ""
        if n.islower() and not n.startswith("_") and line.endswith(".") and n not in line and "(" not in line:
            out.append(("built-in function", n, line))
    std = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(std.glob("*.py")):
        if p.stem.startswith("_") or p.stem == "this":
            continue
        try:
            doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
        except (SyntaxError, UnicodeDecodeError):
            continue
        line = doc.strip().splitlines()[0] if doc.strip() else ""
        if line.endswith(".") and p.stem.lower() not in line.lower() and 3 <= len(line.split()) <= 20:
            out.append(("standard-library module", p.stem, line))
    for s in HTTPStatus:
        out.append(("HTTP status", str(s.value), f"{s.phrase}."))
    return out


def arc_rows(rng: random.Random) -> list[dict]:
    items = _described()
    by_source: dict[str, list[str]] = {}
    for src, name, _ in items:
        by_source.setdefault(src, []).append(name)
    rows = []
    for k, (src, name, line) in enumerate(items):
        wrong = rng.sample([n for n in by_source[src] if n != name], 3)
        choices = [name, *wrong]
        rng.shuffle(choices)
        rows.append(
            {
                "id": f"std-arc-{k:04d}",
                "question": f'Which Python {src} is documented as "{line}"',
                "choices": {"text": choices, "label": list("ABCD")},
                "answerKey": "ABCD"[choices.index(name)],
                "source": src,
            }
        )
    rng.shuffle(rows)
    return rows


def hellaswag_rows(rng: random.Random, sentences: list[tuple[str, str]]) -> list[dict]:
    cut = []
    for topic, s in sentences:
        w = s.split()
        h = len(w) // 2
        cut.append((topic, " ".join(w[: h - 3]), " ".join(w[h - 3 : h]), " ".join(w[h:])))
    rows = []
    for k, (topic, a, b, end) in enumerate(cut):
        others = rng.sample([c[3] for c in cut if c[3] != end], 3)
        endings = [end, *others]
        rng.shuffle(endings)
        rows.append(
            {
                "ind": k,
                "activity_label": topic.replace("-", " ").capitalize(),
                "ctx_a": a,
                "ctx_b": b,
                "ctx": f"{a} {b}",
                "endings": endings,
                "source_id": topic,
                "split": "val",
                "split_type": "indomain",
                "label": str(endings.index(end)),
            }
        )
    return rows


NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivo", "Jun", "Kemi", "Lior", "Mina", "Nils"]
THINGS = ["apples", "stamps", "marbles", "books", "shells", "pencils", "cards", "coins", "plants", "tickets"]


def gsm8k_rows(rng: random.Random, n: int) -> list[dict]:
    """Two- and three-step problems: buy, give away, share, price per item, weekly savings."""
    rows = []
    for _ in range(n):
        who, other = rng.sample(NAMES, 2)
        thing = rng.choice(THINGS)
        kind = rng.randrange(4)
        if kind == 0:
            a, b, c = rng.randint(10, 60), rng.randint(5, 40), rng.randint(2, 9)
            q = (
                f"{who} has {a} {thing}. {who} buys {b} more and then gives {c} to {other}. "
                f"How many {thing} does {who} have now?"
            )
            t = a + b - c
            steps = (
                f"{who} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {thing} after buying.\n"
                f"After giving {c} away, {who} has {a + b} - {c} = <<{a + b}-{c}={t}>>{t} {thing}."
            )
        elif kind == 1:
            per, k = rng.randint(2, 12), rng.randint(3, 9)
            q = f"Each box holds {per} {thing}. {who} fills {k} boxes. How many {thing} are in the boxes?"
            t = per * k
            steps = f"{k} boxes of {per} {thing} hold {k} * {per} = <<{k}*{per}={t}>>{t} {thing}."
        elif kind == 2:
            k = rng.randint(2, 6)
            each = rng.randint(3, 15)
            total = k * each + rng.randint(1, k - 1) if k > 1 else k * each
            left = total - k * each
            q = (
                f"{who} shares {total} {thing} equally among {k} friends and keeps what is left over. "
                f"How many {thing} does {who} keep?"
            )
            t = left
            steps = (
                f"Each friend gets {total} // {k} = <<{total}//{k}={each}>>{each} {thing}.\n"
                f"The friends get {each} * {k} = <<{each}*{k}={each * k}>>{each * k}, so {who} keeps "
                f"{total} - {each * k} = <<{total}-{each * k}={t}>>{t}."
            )
        else:
            save, weeks, spend = rng.randint(3, 20), rng.randint(2, 8), rng.randint(1, 15)
            q = (
                f"{who} saves {save} dollars a week for {weeks} weeks, then spends {spend} dollars on {thing}. "
                f"How many dollars does {who} have left?"
            )
            t = save * weeks - spend
            steps = (
                f"{who} saves {save} * {weeks} = <<{save}*{weeks}={save * weeks}>>{save * weeks} dollars.\n"
                f"After spending {spend}, {who} has {save * weeks} - {spend} = "
                f"<<{save * weeks}-{spend}={t}>>{t} dollars."
            )
        rows.append({"question": q, "answer": f"{steps}\n#### {t}"})
    return rows


def lambada_rows(sentences: list[tuple[str, str]], n: int) -> list[dict]:
    """Passages of two to four consecutive sentences of one topic, ending in a plain word."""
    rows, by_topic = [], {}
    for topic, s in sentences:
        by_topic.setdefault(topic, []).append(s)
    for topic in sorted(by_topic):
        ss = by_topic[topic]
        for i in range(0, len(ss) - 1, 2):
            text = " ".join(ss[i : i + 3]).rstrip(".!?")
            if WORD.match(text.split()[-1]) and len(text.split()) <= 90:
                rows.append({"text": text})
    return rows[:n]


def _parquet(path: Path, rows: list[dict]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path.resolve())


def main(out: Path) -> None:
    import lm_eval

    rng = random.Random(SEED)
    data, tasks = out / "parquet", out / "tasks"
    data.mkdir(parents=True, exist_ok=True)
    tasks.mkdir(exist_ok=True)
    sentences = _sentences()
    rng.shuffle(sentences)
    arc = arc_rows(rng)
    hs = hellaswag_rows(rng, sentences[:220])
    gsm = gsm8k_rows(rng, 140)
    lam = lambada_rows(sorted(sentences[220:]), 200)
    splits = {
        "arc_easy": {"train": arc[:10], "validation": arc[10:20], "test": arc[20:220]},
        "hellaswag": {"train": hs[:10], "validation": hs[10:210]},
        "gsm8k": {"train": gsm[:40], "test": gsm[40:140]},
        "lambada_openai": {"test": lam},
    }
    own = Path(lm_eval.__file__).parent / "tasks"
    origin = {
        "arc_easy": own / "arc" / "arc_easy.yaml",
        "hellaswag": own / "hellaswag" / "hellaswag.yaml",
        "gsm8k": own / "gsm8k" / "gsm8k.yaml",
        "lambada_openai": own / "lambada" / "lambada_openai.yaml",
    }
    counts = {}
    for task, parts in splits.items():
        files = {s: _parquet(data / f"{task}-{s}.parquet", rows) for s, rows in parts.items()}
        counts[task] = {s: len(rows) for s, rows in parts.items()}
        cfg = {"include": str(origin[task]), "task": task, "dataset_path": "parquet", "dataset_name": None}
        cfg["dataset_kwargs"] = {"data_files": files}
        (tasks / f"{task}.yaml").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")  # JSON is YAML
    (out / "source.json").write_text(json.dumps({"python": platform.python_version(), "rows": counts}, indent=2))
    print(f"{out}: {json.dumps(counts)} from Python {platform.python_version()}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_data.py DIR")
    main(Path(sys.argv[1]))
