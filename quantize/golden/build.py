"""Build a golden-set version: items (JSONL), lm-eval task configs (YAML) and the MANIFEST.

The builder is deterministic: every random choice comes from random.Random(f"{seed}:{task}"),
sources are read in file order, and output is written with sorted keys and '\n' line ends, so
the same sources and seed give byte-identical files.

Tasks of golden/core (each item has an `id` and a `cluster`, the source document or template):
    core_facts    4-way multiple choice: capitals, elements, collective nouns, young animals, female forms
    core_cloze    last word of a sentence of held-out prose (Jargon File held-out split, Devil's Dictionary)
    core_analogy  5-shot word analogies, "a is to b as c is to" -> d
    core_kv       in-context key-value recall: a list of "key: value" pairs, then one key
    core_prose    perplexity (loglikelihood_rolling) of held-out prose documents, one score per document
"""

from __future__ import annotations

import json
import random
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantize.errors import EXIT_OK, EXIT_USAGE, UsageError
from quantize.golden import sources as src
from quantize.golden.manifest import Manifest
from quantize.golden.render import built_text
from quantize.golden.version import check_new_version, jsonl, write_files, yaml_bytes
from quantize.io import read_user_text, sha256_user_file
from quantize.kinds import ROLLING_METRICS

TASK_VERSION = 1.0
GROUP = "core"


@dataclass(frozen=True)
class Sizes:
    """Items per task (upper bounds; a source may hold fewer) and the version's item design."""

    facts: int = 700
    cloze: int = 500
    analogy: int = 400
    kv: int = 250
    prose: int = 120
    smoke: int = 8  # fixed ids per task for the tests
    reverse_facts: bool = False  # also ask each fact the other way round (capital -> country, name -> symbol)
    kv_own_clusters: bool = False  # every key-value item its own cluster: the lists are drawn independently

    @classmethod
    def for_version(cls, version: str) -> Sizes:
        """v1: sized by the CPU budget. v2: sized from v1's flip rates against FP8 so that each accuracy task
        resolves a 2-point drop at one-sided alpha 0.05, power 0.8 (n = 6.18 f / m^2, golden/core/README.md):
        facts 861 (the quiz files hold 629 one way: reversed questions add the rest), cloze 402, analogy 1,276,
        key-value 1,546; prose documents for a +-1% perplexity-ratio bound."""
        if version == "v1":
            return cls()
        return cls(facts=1000, cloze=500, analogy=1400, kv=1700, prose=200, reverse_facts=True, kv_own_clusters=True)


def _rng(seed: int, task: str) -> random.Random:
    return random.Random(f"{seed}:{task}")


def _id(task: str, i: int) -> str:
    return f"{task}-{i:05d}"


# --- core_facts ------------------------------------------------------------------------------------

# (quiz file, question template, answer field, subject field, cluster)
FACT_TEMPLATES = [
    ("africa", "What is the capital of {s}?", 1, 0, "capital-africa"),
    ("america", "What is the capital of {s}?", 1, 0, "capital-america"),
    ("asia", "What is the capital of {s}?", 1, 0, "capital-asia"),
    ("europe", "What is the capital of {s}?", 1, 0, "capital-europe"),
    ("state", "What is the capital of the US state of {s}?", 1, 0, "capital-us-state"),
    ("elements", "Which chemical element has the symbol {s}?", 3, 0, "element-symbol"),
    ("elements", "Which chemical element has atomic number {s}?", 3, 1, "element-number"),
    ("collectives", "What is the collective noun for a group of {s}?", 1, 0, "collective-noun"),
    ("babies", "What is a young {s} called?", 0, 1, "young-animal"),
    ("sexes", "What is the female counterpart of a {s}?", 1, 0, "female-form"),
]
# v2 onwards: the same facts asked the other way round (answer and subject fields swapped)
REVERSE_FACT_TEMPLATES = [
    ("africa", "Which country has {s} as its capital?", 0, 1, "country-africa"),
    ("america", "Which country has {s} as its capital?", 0, 1, "country-america"),
    ("asia", "Which country has {s} as its capital?", 0, 1, "country-asia"),
    ("europe", "Which country has {s} as its capital?", 0, 1, "country-europe"),
    ("state", "Which US state has {s} as its capital?", 0, 1, "us-state"),
    ("elements", "What is the chemical symbol of {s}?", 0, 3, "symbol-of-element"),
    ("elements", "What is the atomic number of {s}?", 1, 3, "number-of-element"),
]


def build_facts(quiz_dir: Path, seed: int, n: int, reverse: bool = False) -> list[dict[str, Any]]:
    rng = _rng(seed, "core_facts")
    items = []
    for fname, template, ans_f, subj_f, cluster in FACT_TEMPLATES + (REVERSE_FACT_TEMPLATES if reverse else []):
        rows = src.quiz_rows(quiz_dir / fname)
        answers = sorted({r[ans_f][0] for r in rows})
        for r in rows:
            answer, accepted = r[ans_f]
            pool = [a for a in answers if a.lower() not in accepted and a.lower() != answer.lower()]
            # a distractor must not be a correct answer of this subject (e.g. "kitten" for a young fox)
            pool = [
                a for a in pool if not any(a.lower() in rr[ans_f][1] and rr[subj_f][1] & r[subj_f][1] for rr in rows)
            ]
            if len(pool) < 3:
                continue
            choices = rng.sample(pool, 3) + [answer]
            rng.shuffle(choices)
            items.append(
                {
                    "question": f"Question: {template.format(s=r[subj_f][0])}\nAnswer:",
                    "choices": choices,
                    "answer": choices.index(answer),
                    "cluster": cluster,
                }
            )
    rng.shuffle(items)
    return [{"id": _id("facts", i), **it} for i, it in enumerate(items[:n])]


# --- prose documents: the cloze and perplexity tasks share them, never an item twice ---------------


def prose_documents(jargon_gz: Path, devil_dz: Path) -> list[dict[str, str]]:
    docs = [
        {"doc": f"jargon:{h}", "text": t} for h, t in src.jargon_entries(jargon_gz) if src.jargon_split(h) == "heldout"
    ]
    docs += [
        {"doc": f"devil:{h}", "text": t.replace(" abcdefghijklmnopqrstuvwxyz", "")}
        for h, t in src.devil_entries(devil_dz)
    ]
    return docs


SENTENCE_END = re.compile(r"\b([A-Za-z]{4,})([.!?])(?=\s|$)")


def build_cloze_and_prose(
    docs: list[dict[str, str]], seed: int, n_cloze: int, n_prose: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Perplexity documents first (120-400 words), then cloze items from the other documents."""
    rng = _rng(seed, "core_prose")
    order = list(range(len(docs)))
    rng.shuffle(order)
    prose, used = [], set()
    for i in order:
        words = len(docs[i]["text"].split())
        if 120 <= words <= 400 and len(prose) < n_prose:
            prose.append({"id": _id("prose", len(prose)), "text": docs[i]["text"], "cluster": docs[i]["doc"]})
            used.add(i)
    rng = _rng(seed, "core_cloze")
    cloze = []
    for i in order:
        if i in used or len(cloze) >= n_cloze:
            continue
        text = docs[i]["text"]
        ends = [m for m in SENTENCE_END.finditer(text) if len(text[: m.start(1)].split()) >= 25]
        for m in rng.sample(ends, min(2, len(ends))):  # up to two items per document: a real cluster
            context = " ".join(text[: m.start(1)].split()[-60:])  # the last 60 words: enough context, cheap to score
            cloze.append(
                {
                    "id": _id("cloze", len(cloze)),
                    "context": context,
                    "target": " " + m.group(1),
                    "cluster": docs[i]["doc"],
                }
            )
    return cloze[:n_cloze], prose


# --- core_analogy --------------------------------------------------------------------------------


def build_analogy(path: Path, seed: int, n: int, shots: int = 5) -> list[dict[str, Any]]:
    rng = _rng(seed, "core_analogy")
    sections = src.analogies(path)
    per_section = -(-n // len(sections))
    items = []
    for name, rows in sections.items():
        picks = rng.sample(rows, min(per_section, len(rows)))
        for a, b, c, d in picks:
            words = {a, b, c, d}
            examples = [r for r in rows if not words & set(r)]
            demo = rng.sample(examples, shots)
            lines = [f"{x} is to {y} as {z} is to {w}." for x, y, z, w in demo]
            items.append(
                {"context": "\n".join(lines + [f"{a} is to {b} as {c} is to"]), "target": f" {d}", "cluster": name}
            )
    rng.shuffle(items)
    return [{"id": _id("analogy", i), **it} for i, it in enumerate(items[:n])]


# --- core_kv -------------------------------------------------------------------------------------

KV_PAIRS = (4, 6, 8)


def build_kv(nouns: list[str], seed: int, n: int, own_clusters: bool = False) -> list[dict[str, Any]]:
    rng = _rng(seed, "core_kv")
    items = []
    for i in range(n):
        k = KV_PAIRS[i % len(KV_PAIRS)]
        words = rng.sample(nouns, 2 * k)
        keys, values = words[:k], words[k:]
        q = rng.randrange(k)
        lines = [f"{key}: {value}" for key, value in zip(keys, values, strict=False)]
        # the query repeats a key's own line prefix: recall by copying from context (induction),
        # not by reading an instruction
        context = "Here is a list of key: value pairs.\n" + "\n".join(lines) + f"\n\nLook up {keys[q]}.\n{keys[q]}:"
        cluster = _id("kv", i) if own_clusters else f"kv-{k}-pairs"
        items.append({"id": _id("kv", i), "context": context, "target": f" {values[q]}", "cluster": cluster})
    return items


# --- task configs --------------------------------------------------------------------------------


def task_configs() -> dict[str, dict[str, Any]]:
    common = {"dataset_path": "json", "test_split": "test", "metadata": {"version": TASK_VERSION}}

    def data(name: str) -> dict[str, Any]:
        return {"dataset_kwargs": {"data_files": {"test": f"../data/{name}.jsonl"}}}

    loglik = {
        "output_type": "loglikelihood",
        "doc_to_text": "{{context}}",
        "doc_to_target": "{{target}}",
        "target_delimiter": "",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
        ],
    }
    return {
        "core_facts": {
            "task": "core_facts",
            **common,
            **data("facts"),
            "output_type": "multiple_choice",
            "doc_to_text": "question",
            "doc_to_choice": "choices",
            "doc_to_target": "answer",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        },
        "core_cloze": {"task": "core_cloze", **common, **data("cloze"), **loglik},
        "core_analogy": {"task": "core_analogy", **common, **data("analogy"), **loglik},
        "core_kv": {"task": "core_kv", **common, **data("kv"), **loglik},
        "core_prose": {
            "task": "core_prose",
            **common,
            **data("prose"),
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [dict(m) for m in ROLLING_METRICS],
        },
    }


def group_config(tasks: list[str]) -> dict[str, Any]:
    return {"group": GROUP, "task": tasks, "metadata": {"version": TASK_VERSION}}


RECORDED = ("jargon", "devil", "analogies", "wordnet", "quiz")  # what build_core reads, by its record's names
QUIZ_DIR = "usr/share/games/bsdgames/quiz"


def check_sources_record(meta: Any, record: Path) -> None:
    """fetch_sources.sh's record: an object naming each source build_core reads (RECORDED), each with its `files`
    (paths inside the folder) and a sha256 for every one of them, the quiz files the facts read among them. A list,
    a string, a source missing or a file without its sha256 was exit 3 (AttributeError, TypeError, KeyError), and
    a record of empty sha256 maps built from files nothing checked (a review)."""

    def bad(why: str) -> UsageError:
        return UsageError(f"{record}: {why}; {src.HINT}")

    if not isinstance(meta, dict):
        raise bad(f"holds a JSON {type(meta).__name__}, not an object of sources")
    for name, s in meta.items():
        files = s.get("files") if isinstance(s, dict) else None
        digests = s.get("sha256") if isinstance(s, dict) else None
        if not (isinstance(files, list) and files and all(isinstance(f, str) and f for f in files)):
            raise bad(f"source {name!r} lists no `files` (a list of paths inside the sources folder)")
        if not isinstance(digests, dict) or not all(
            isinstance(d, str) and re.fullmatch(r"[0-9a-f]{64}", d) for d in digests.values()
        ):
            raise bad(f"source {name!r}'s `sha256` is not an object of file paths to sha256 hex digests")
        if unchecked := [f for f in files if f not in digests]:
            raise bad(f"source {name!r}'s file {unchecked[0]} has no sha256: nothing would check what is read")
        if outside := [f for f in digests if Path(f).is_absolute() or ".." in Path(f).parts]:
            raise bad(f"source {name!r} names {outside[0]!r}, a path outside the sources folder")
    if missing := [n for n in RECORDED if n not in meta]:
        raise bad(f"names no source {', '.join(missing)} (build_core reads {', '.join(RECORDED)})")
    quiz = {f"{QUIZ_DIR}/{t[0]}" for t in FACT_TEMPLATES + REVERSE_FACT_TEMPLATES}
    if unrecorded := sorted(quiz - set(meta["quiz"]["sha256"])):
        raise bad(f"source 'quiz' records no sha256 for {unrecorded[0]}, which the facts read")


def build_core(sources_dir: Path, out: Path, seed: int = 1234, sizes: Sizes | None = None) -> Manifest:
    """Build golden/core/<version> from a folder made by fetch_sources.sh (sizes from the version's name)."""
    sizes = sizes or Sizes.for_version(out.name)
    record = sources_dir / "sources.json"
    try:
        meta = json.loads(read_user_text(record, "golden sources record", 2**20, hint=src.HINT))
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{record} is not JSON ({str(e)[:120]}); {src.HINT}") from None
    check_sources_record(meta, record)
    x = sources_dir / "x"
    for s in meta.values():  # the sources must be the ones recorded
        for f, digest in s["sha256"].items():
            if sha256_user_file(x / f, "golden source file", src.MAX_SOURCE_BYTES, hint=src.HINT) != digest:
                raise UsageError(
                    f"source file {x / f} does not match the sha256 recorded in {sources_dir / 'sources.json'}; "
                    "fetch the sources again (golden/core/fetch_sources.sh)"
                )
    quiz_dir = x / QUIZ_DIR
    docs = prose_documents(x / meta["jargon"]["files"][0], x / meta["devil"]["files"][0])
    cloze, prose = build_cloze_and_prose(docs, seed, sizes.cloze, sizes.prose)
    data = {
        "facts": build_facts(quiz_dir, seed, sizes.facts, sizes.reverse_facts),
        "cloze": cloze,
        "analogy": build_analogy(x / meta["analogies"]["files"][0], seed, sizes.analogy),
        "kv": build_kv(src.wordnet_nouns(x / meta["wordnet"]["files"][0]), seed, sizes.kv, sizes.kv_own_clusters),
        "prose": prose,
    }
    check_items_found(data, meta, sizes)
    return write_version(out, data, meta, seed, sizes)


SOURCES = {"facts": ["quiz"], "cloze": ["jargon", "devil"], "analogy": ["analogies"], "kv": ["wordnet"]}
SOURCES["prose"] = SOURCES["cloze"]


def check_items_found(data: dict[str, list[dict[str, Any]]], meta: dict[str, Any], sizes: Sizes) -> None:
    """Before anything is written: every task holds items. A task with none verified and was scored until lm-eval
    stopped on its empty split (StopIteration, exit 3); its sources are named instead."""
    for name, found in data.items():
        if found:
            continue
        files = "; ".join(f"{k}: {', '.join(meta[k]['files'])}" for k in SOURCES[name])
        why = (
            f" (cloze items are cut from the documents core_prose leaves, which takes up to {sizes.prose} of 120 to "
            "400 words, and need a sentence end after 25 words)"
            if name == "cloze"
            else ""
        )
        raise UsageError(
            f"golden build: task {GROUP}_{name} would hold no items: its sources ({files}) gave none{why}. Every task "
            "of a golden set needs items: fetch the full sources (golden/core/fetch_sources.sh DIR) and build again"
        )


def write_version(
    out: Path, data: dict[str, list[dict[str, Any]]], sources: dict[str, Any], seed: int, sizes: Sizes
) -> Manifest:
    """core's files and manifest fields, written by the one version writer (quantize/golden/version.py)."""
    files: dict[str, bytes] = {f"data/{name}.jsonl": jsonl(items) for name, items in data.items()}
    configs = task_configs()
    for task, cfg in configs.items():
        files[f"tasks/{task}.yaml"] = yaml_bytes(cfg)
    files[f"tasks/{GROUP}.yaml"] = yaml_bytes(group_config(list(configs)))
    smoke = {
        f"core_{name}": [it["id"] for it in _rng(seed, f"smoke:{name}").sample(items, min(sizes.smoke, len(items)))]
        for name, items in data.items()
    }
    fields = {
        "name": "core",
        "version": out.name,
        "group": GROUP,
        "task_version": TASK_VERSION,
        "seed": seed,
        "builder": {
            "command": "bash golden/core/fetch_sources.sh DIR && python golden/core/build.py --sources DIR "
            f"--out golden/core/{shlex.quote(out.name)} --seed {seed}",
            "module": "quantize.golden.build",
        },
        "sources": sources,
        "smoke_ids": smoke,
        "note": "Public-domain and openly licensed texts the default model may have seen in training: absolute "
        "perplexity is not held-out; comparisons between checkpoints on the same items are still fair.",
    }
    return write_files(out, files, fields)


def build(sources_dir: Path, out: Path, seed: int = 1234) -> Manifest:
    """`quantize golden build` and golden/core/build.py: refuse an existing version, then build it."""
    check_new_version(out)
    if not (sources_dir / "sources.json").is_file():
        raise UsageError(
            f"--sources {sources_dir}: no sources.json there; fetch the sources with "
            f"`bash golden/core/fetch_sources.sh {sources_dir}` first"
        )
    return build_core(sources_dir, out, seed)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Build golden/core/<version> from fetched sources.")
    ap.add_argument("--sources", required=True, type=Path, help="folder written by golden/core/fetch_sources.sh")
    ap.add_argument("--out", type=Path, default=Path("golden/core/v1"))
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    try:
        m = build(args.sources, args.out, args.seed)
    except UsageError as e:
        print(f"golden/core/build.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE

    print(built_text(m))
    return EXIT_OK
