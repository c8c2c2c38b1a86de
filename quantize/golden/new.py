"""`quantize golden new OUT --from FILE --type TYPE`: a user's JSONL becomes a golden-set version.

One JSON object per line, of one item type:

    multiple_choice  {"question": str, "choices": [str, ...], "answer": index or the right choice}
    greedy           {"context": str, "target": str}         right when the target is the greedy continuation
    perplexity       {"text": str}                            a document, scored token by token
    generate         {"prompt": str, "answer": str}           greedy generation until a stop sequence,
                                                              exact match after an optional regex
and optionally "id" (stable; default: <task>-<line>) and "cluster" (items that share one are not
independent; default: every item its own). The file is checked whole before anything is written:
the first bad line (not UTF-8, over 64 KiB, not a JSON object, a missing or empty field, a field of
another item type, an answer not among the choices, a duplicate id) is one message naming the line,
exit 2, and no folder.
"""

from __future__ import annotations

import json
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantize.errors import UsageError
from quantize.golden.manifest import Manifest
from quantize.golden.version import ROLLING_METRICS, TaskFiles, check_new_version, write_version
from quantize.io import user_lines

MAX_LINE = 64 * 1024
MAX_FILE = 256 * 2**20

FIELDS: dict[str, tuple[str, ...]] = {
    "multiple_choice": ("question", "choices", "answer"),
    "greedy": ("context", "target"),
    "perplexity": ("text",),
    "generate": ("prompt", "answer"),
}
OPTIONAL = ("id", "cluster")
OUTPUT_TYPE = {
    "multiple_choice": "multiple_choice",
    "greedy": "loglikelihood",
    "perplexity": "loglikelihood_rolling",
    "generate": "generate_until",
}


def task_config(kind: str, regex: str | None, stop: list[str], max_gen_toks: int) -> dict[str, Any]:
    """The lm-eval task config of an item type (dataset part added by write_version)."""
    acc = [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]
    if kind == "multiple_choice":
        return {
            "output_type": "multiple_choice",
            "doc_to_text": "question",
            "doc_to_choice": "choices",
            "doc_to_target": "answer",
            "metric_list": acc,
        }
    if kind == "greedy":
        return {
            "output_type": "loglikelihood",
            "doc_to_text": "context",
            "doc_to_target": "target",
            "target_delimiter": "",
            "metric_list": [*acc, {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False}],
        }
    if kind == "perplexity":
        return {
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": "text",
            "metric_list": [dict(m) for m in ROLLING_METRICS],
        }
    steps: list[dict[str, Any]] = []
    if regex is not None:
        steps.append({"function": "regex", "regex_pattern": regex, "group_select": 0, "fallback": "[no match]"})
    steps.append({"function": "take_first"})
    return {
        "output_type": "generate_until",
        "doc_to_text": "prompt",
        "doc_to_target": "answer",
        "generation_kwargs": {"until": stop, "do_sample": False, "max_gen_toks": max_gen_toks},
        "filter_list": [{"name": "regex" if regex is not None else "raw", "filter": steps}],
        "metric_list": [
            {
                "metric": "exact_match",
                "aggregation": "mean",
                "higher_is_better": True,
                "ignore_case": True,
                "regexes_to_ignore": [r"^\s+", r"\s+$"],
            }
        ],
    }


def _text(v: Any) -> bool:
    return isinstance(v, str) and v.strip() != ""


def check_item(kind: str, obj: Any, where: str) -> dict[str, Any]:
    """One validated, normalized item (answer as an index; id and cluster as NFC strings)."""
    _check_keys(kind, obj, where)
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(
            f"{where} holds text that is not valid Unicode ({e.reason}, e.g. a lone surrogate "
            "escape like \\ud800); fix the line"
        ) from None
    item = {f: _optional(obj[f], f, where) for f in OPTIONAL if f in obj}
    for f in FIELDS[kind]:
        if f == "answer" and kind == "multiple_choice":
            item[f] = _choice_index(obj["answer"], obj["choices"], where)
        elif f == "choices":
            item[f] = _choices(obj[f], where)
        elif not _text(obj[f]):
            raise UsageError(f"{where}: {f} is {json.dumps(obj[f])[:80]}; it must be a non-empty string")
        else:
            item[f] = obj[f]
    return item


def _check_keys(kind: str, obj: Any, where: str) -> None:
    """An object with exactly a `kind` item's fields (and optionally id, cluster); another kind's fields named."""
    if not isinstance(obj, dict):
        raise UsageError(f"{where} holds a JSON {type(obj).__name__}, not an object with {', '.join(FIELDS[kind])}")
    if extra := sorted(set(obj) - set(FIELDS[kind]) - set(OPTIONAL)):
        other = [k for k, f in FIELDS.items() if k != kind and set(extra) & set(f)]
        what = f"fields of a {other[0]} item ({', '.join(extra)})" if other else f"unknown fields {', '.join(extra)}"
        raise UsageError(
            f"{where} has {what} in a {kind} file; every line must be a {kind} item with "
            f"{', '.join(FIELDS[kind])} (and optionally id, cluster)"
        )
    if missing := [f for f in FIELDS[kind] if f not in obj]:
        raise UsageError(f"{where} lacks {', '.join(missing)}: a {kind} item has {', '.join(FIELDS[kind])}")


def _optional(v: Any, f: str, where: str) -> str:
    """An id or cluster as its NFC form (two spellings of one name are one id); control and zero-width
    characters are refused (two ids that look the same must not count as different items)."""
    if isinstance(v, bool) or not (_text(v) or isinstance(v, int)):
        raise UsageError(f"{where}: {f} is {json.dumps(v)[:80]}; it must be a non-empty string or an integer")
    s = unicodedata.normalize("NFC", str(v))
    if bad := sorted({c for c in s if unicodedata.category(c) in ("Cc", "Cf")}):
        shown = ", ".join(f"U+{ord(c):04X}" for c in bad)
        raise UsageError(f"{where}: {f} {s!r} holds control or invisible characters ({shown}); remove them")
    return s


def _choices(v: Any, where: str) -> list[str]:
    if not isinstance(v, list) or len(v) < 2 or not all(_text(c) for c in v):
        raise UsageError(f"{where}: choices must be a list of at least two non-empty strings")
    if len(set(v)) != len(v):
        raise UsageError(f"{where}: choices repeat a choice ({json.dumps(v)[:120]}); each must be different")
    return v


def _choice_index(a: Any, choices: list[str], where: str) -> int:
    """A multiple-choice answer as the index of the right choice: given as that index, or as the choice's text."""
    if isinstance(a, int) and not isinstance(a, bool) and 0 <= a < len(choices):
        return a
    if isinstance(a, str) and a in choices:
        return choices.index(a)
    raise UsageError(
        f"{where}: answer {json.dumps(a)[:80]} is not among the choices; give the right choice's text or "
        f"its index 0..{len(choices) - 1}"
    )


def read_items(path: Path, kind: str, task: str) -> tuple[list[dict[str, Any]], str]:
    """Every line of the file as a checked item, with ids and clusters filled in, and the sha256 of the bytes read
    (one pass: the file hashed is the file checked). The file is read the one safe way (quantize/io.py: a regular
    file, at most MAX_FILE bytes, line by line)."""
    items, seen = [], {}
    with user_lines(path, "--from", MAX_FILE, MAX_LINE, hint="give a JSONL file, one item per line") as lines:
        for n, raw in lines:
            where = f"{path} line {n}"
            line = lines.text(n, raw)
            if not line.strip():
                raise UsageError(f"{where} is empty; remove it (one JSON object per line)")
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise UsageError(f"{where} is not valid JSON ({str(e)[:120]}); one JSON object per line") from None
            item = check_item(kind, obj, where)
            item.setdefault("id", f"{task}-{n:05d}")
            if item["id"] in seen:
                raise UsageError(
                    f"{where}: id {item['id']!r} is already used on line {seen[item['id']]}; ids must be unique"
                )
            seen[item["id"]] = n
            items.append(item)
        digest = lines.hexdigest()
    if not items:
        raise UsageError(f"{path} has no items; write one JSON object per line")
    if any("cluster" in it for it in items) and not all("cluster" in it for it in items):
        first = next(i for i, it in enumerate(items, 1) if "cluster" not in it)
        raise UsageError(f"{path} line {first} has no cluster while other lines do; give every item one, or none")
    return items, digest


@dataclass(frozen=True)
class Generation:
    """How a `generate` item is answered: `regex` extracts the answer (its one group, if it has one), `stop`
    sequences end it (default a newline), at most `max_gen_toks` tokens."""

    regex: str | None = None
    stop: tuple[str, ...] = ()
    max_gen_toks: int = 32

    def check(self, kind: str) -> None:
        if kind != "generate" and (self.regex is not None or self.stop):
            raise UsageError("--regex and --stop apply to --type generate only")
        if self.regex is not None:
            try:
                if re.compile(self.regex).groups > 1:
                    raise UsageError(
                        f"--regex {self.regex!r} has several groups; use one group around the answer, or none"
                    )
            except re.error as e:
                raise UsageError(f"--regex {self.regex!r} is not a valid regular expression: {e}") from None
        if self.max_gen_toks < 1 or self.max_gen_toks > 4096:
            raise UsageError(f"--max-gen-toks {self.max_gen_toks}: give 1..4096 tokens")

    def argv(self, kind: str) -> list[str]:
        """The flags that rebuild this generation setting (the manifest's builder command)."""
        out = ["--regex", self.regex] if self.regex is not None else []
        for s in self.stop:
            out += ["--stop", s]
        return out + (["--max-gen-toks", str(self.max_gen_toks)] if kind == "generate" else [])


def new_version(
    out: Path, source: Path, kind: str, task: str | None = None, gen: Generation = Generation(), seed: int = 0
) -> Manifest:
    """Check the file whole, then write the version folder. Returns the manifest."""
    out = Path(out)
    check_new_version(out)
    task = task or f"{out.parent.name}_{kind}"
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_\-]{0,63}", task):
        raise UsageError(f"--task {task!r}: a task name is a letter, then letters, digits, '_' or '-' (at most 64)")
    gen.check(kind)
    items, digest = read_items(Path(source), kind, task)
    clustered = "cluster" in items[0]
    tf = TaskFiles(
        name=task,
        output_type=OUTPUT_TYPE[kind],
        items=items,
        config=task_config(kind, gen.regex, list(gen.stop) or ["\n"], gen.max_gen_toks),
        id_field="id",
        cluster_field="cluster" if clustered else None,
        source={"file": str(source), "sha256": digest},
    )
    command = ["quantize", "golden", "new", str(out), "--from", str(source), "--type", kind, "--task", task]
    return write_version(
        out,
        [tf],
        sources={"file": tf.source},
        builder={"command": shlex.join(command + gen.argv(kind)), "module": "quantize.golden.new"},
        seed=seed,
    )
