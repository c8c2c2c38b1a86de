"""What `golden verify` checks inside a version's item files, line by line, as it hashes them (one pass, memory
bounded by the longest line and the ids seen; quantize/io.UserLines).

Each line of a task's data file is one JSON object with:

    its id field        a string or an integer, unique in the file once NFC-normalized and stripped (two ids
                        that print alike would silently pair as one item, or not at all)
    its cluster field   present, when the task names one
    golden_shots        (a frozen few-shot task) a list of the task's few-shot ids (MANIFEST `fewshot_ids`, one per
                        line of data/<task>.fewshot.jsonl), with golden_context the text before the question
    answer and choices  (multiple choice) what the task's `doc_to_choice` gives is a list of strings and what its
                        `doc_to_target` gives is an index inside it (or one of its strings, or a list of those),
                        computed as lm-eval computes them: a field name, or a Jinja template rendered in a sandbox

A few-shot file holds one JSON object per line, one per `fewshot_ids` entry. Every problem is one line naming the
file, the line, the field and what is wrong; `verify` (manifest.py) lists them and exits 2.
"""

from __future__ import annotations

import ast
import json
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from quantize.io import UserLines

MAX_ITEM_BYTES = 16 * 2**20  # one item, one line: a long document or few-shot context is kilobytes
MAX_SET_FILE_BYTES = 16 * 2**30  # one data file, streamed: the cap stops a file that never ends, not a large set
# the most items one task can hold: its data file at the cap, every item the shortest JSON object with an id
MAX_TASK_ITEMS = MAX_SET_FILE_BYTES // len(b'{"":0}\n')
SHOWN = 3  # problems listed per file; the rest are counted
# the fields a frozen few-shot item pins its prompt in (written by quantize/golden/prompts.py; this module imports
# no lm-eval, so every reader of a golden set can verify it)
CONTEXT_FIELD = "golden_context"
SHOTS_FIELD = "golden_shots"


def id_key(value: Any) -> str:
    """An item id as the gate pairs it: its text, NFC-normalized and stripped."""
    return unicodedata.normalize("NFC", str(value)).strip()


@dataclass
class TaskRules:
    """What one task's items must hold: its keys, the few-shot ids its items may pin, and (multiple choice) the
    task YAML's doc_to_target and doc_to_choice."""

    task: str
    id_field: str
    cluster_field: str | None
    shots: frozenset[str] | None  # None: the task has no few-shot file, so no item may pin shots
    target: Any = None
    choice: Any = None
    compiled: dict[str, Any] = field(default_factory=dict)  # the Jinja templates among target and choice


@dataclass
class Findings:
    """One file's problems (the first SHOWN, and how many more) and the ids its items hold."""

    name: str
    problems: list[str] = field(default_factory=list)
    more: int = 0
    ids: set[str] = field(default_factory=set)

    def add(self, n: int, what: str) -> None:
        if len(self.problems) < SHOWN:
            self.problems.append(f"{self.name} line {n}: {what}")
        else:
            self.more += 1

    def lines(self) -> list[str]:
        tail = [f"{self.name}: {self.more} more lines with problems like these"] if self.more else []
        return self.problems + tail


def _object(n: int, raw: bytes, found: Findings) -> dict[str, Any] | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        found.add(n, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); save the file as UTF-8")
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        found.add(n, f"not JSON ({str(e)[:100]}); each line is one JSON object")
        return None
    if not isinstance(doc, dict):
        found.add(n, f"a JSON {type(doc).__name__}, not an object; each line is one JSON object")
        return None
    return doc


def check_items(lines: UserLines, name: str, rules: TaskRules) -> Findings:
    """Every line of a task's data file against `rules` (module docstring)."""
    found, first = Findings(name), {}
    for n, raw in lines:
        doc = _object(n, raw, found)
        if doc is None:
            continue
        for problem in _item_problems(doc, rules, n, first):
            found.add(n, problem)
    found.ids = set(first)
    return found


def _item_problems(doc: dict[str, Any], rules: TaskRules, n: int, first: dict[str, int]) -> list[str]:
    out = []
    i = doc.get(rules.id_field)
    if isinstance(i, bool) or not isinstance(i, str | int) or not id_key(i):
        out.append(f"field {rules.id_field!r} (the item's id) is {json.dumps(i)[:60]}; give a non-empty string")
    elif (key := id_key(i)) in first:
        out.append(
            f"id {key!r} (field {rules.id_field!r}) is already used on line {first[key]}; ids must be unique (the gate "
            "pairs items by id)"
        )
    else:
        first[key] = n
    if rules.cluster_field and rules.cluster_field not in doc:
        out.append(f"no field {rules.cluster_field!r}, the task's cluster field; give every item its cluster")
    out += _shot_problems(doc, rules)
    if rules.target is not None or rules.choice is not None:
        out += _choice_problems(doc, rules)
    return out


def _shot_problems(doc: dict[str, Any], rules: TaskRules) -> list[str]:
    shots = doc.get(SHOTS_FIELD)
    if rules.shots is None:
        return [f"field {SHOTS_FIELD!r} pins few-shot examples, but the task has no few-shot file"] if shots else []
    if not isinstance(doc.get(CONTEXT_FIELD), str):
        return [f"no field {CONTEXT_FIELD!r} (text): a frozen few-shot item carries the prompt before its question"]
    if not isinstance(shots, list) or not all(isinstance(s, str) for s in shots):
        return [f"field {SHOTS_FIELD!r} is {json.dumps(shots)[:60]}; it must be a list of the task's few-shot ids"]
    if missing := [s for s in shots if s not in rules.shots]:
        return [
            f"field {SHOTS_FIELD!r} names {missing[0]!r}, which is not one of the task's few-shot examples "
            "(MANIFEST fewshot_ids); pins name the few-shot file's examples only"
        ]
    return []


def _choice_problems(doc: dict[str, Any], rules: TaskRules) -> list[str]:
    try:
        choices = _doc_to(rules, "choice", doc)
        target = _doc_to(rules, "target", doc)
    except _Unreadable as e:
        return [str(e)]
    if isinstance(choices, dict):
        choices = list(choices.values())
    spec = f"doc_to_target {json.dumps(rules.target)[:60]}"
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        return [
            f"doc_to_choice {json.dumps(rules.choice)[:60]} gives {json.dumps(choices, default=str)[:80]}, not a "
            "list of strings; give each item its choices"
        ]
    for t in target if isinstance(target, list) and target else [target]:
        if isinstance(t, str) and t in choices:
            continue
        if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < len(choices):
            continue
        return [
            f"{spec} gives {json.dumps(t, default=str)[:60]}, which is not a choice: give an index "
            f"0..{len(choices) - 1} of the item's {len(choices)} choices (or one of them)"
        ]
    return []


def choices(rules: TaskRules, doc: dict[str, Any]) -> list[str] | None:
    """A multiple-choice item's choices as lm-eval's doc_to_choice gives them (a dict's values), or None where
    they do not read as a list of strings."""
    try:
        found = _doc_to(rules, "choice", doc)
    except _Unreadable:
        return None
    found = list(found.values()) if isinstance(found, dict) else found
    return [str(c) for c in found] if isinstance(found, list) else None


def gold(rules: TaskRules, doc: dict[str, Any]) -> int | None:
    """The index of a multiple-choice item's right choice, as lm-eval computes it from the task YAML's doc_to_target
    and doc_to_choice (an index, or the choice's own string); None where they give no single index."""
    try:
        choices, target = _doc_to(rules, "choice", doc), _doc_to(rules, "target", doc)
    except _Unreadable:
        return None
    if isinstance(choices, dict):
        choices = list(choices.values())
    if isinstance(target, str) and isinstance(choices, list) and target in choices:
        return choices.index(target)
    return target if isinstance(target, int) and not isinstance(target, bool) else None


class _Unreadable(Exception):
    """A doc_to_target/doc_to_choice that gives nothing for this item (lm-eval would fail on it)."""


def _doc_to(rules: TaskRules, which: str, doc: dict[str, Any]) -> Any:
    """lm-eval's doc_to_target / doc_to_choice of one document (lm_eval.api.task.ConfigurableTask): an item field
    by name, a constant, or a Jinja template rendered here in a sandbox (a target of digits is an index; a choice
    list is a Python literal)."""
    spec = rules.target if which == "target" else rules.choice
    if not isinstance(spec, str):
        return spec
    if spec in doc:
        return doc[spec]
    template = rules.compiled.get(which)
    if template is None:
        raise _Unreadable(f"doc_to_{which} {spec!r} is neither a field of the item nor a template")
    try:
        text = template.render(**doc)
    except Exception as e:  # any error a template raises on this item is the item's problem
        raise _Unreadable(f"doc_to_{which} {spec!r} fails on this item ({type(e).__name__}: {str(e)[:80]})") from None
    if which == "target":
        if text.isdigit() and rules.choice is not None:
            return int(text)
        if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
            try:
                return ast.literal_eval(text)
            except (SyntaxError, ValueError):
                return text
        return text
    try:
        return ast.literal_eval(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise _Unreadable(f"doc_to_choice {spec!r} gives {text[:80]!r}, not a list") from None


def compile_templates(rules: TaskRules) -> str | None:
    """Compile the task's target and choice templates in Jinja's sandbox (no attribute a template reaches can
    change anything); returns a problem when one is not a template this can render (then nothing is compiled)."""
    from jinja2 import StrictUndefined, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
    for which, spec in (("target", rules.target), ("choice", rules.choice)):
        if isinstance(spec, str) and "{" in spec:
            try:
                rules.compiled[which] = env.from_string(spec)
            except TemplateError as e:
                rules.compiled.clear()
                return f"doc_to_{which} {spec[:60]!r} is not a template this check can render ({str(e)[:80]})"
    return None


def check_fewshot(lines: UserLines, name: str, ids: list[str]) -> Findings:
    """A few-shot file: one JSON object per line, as many lines as the task's `fewshot_ids`."""
    found, count = Findings(name), 0
    for n, raw in lines:
        count = n
        _object(n, raw, found)
    if count != len(ids):
        found.problems.append(
            f"{name}: {count} few-shot examples, but the manifest's fewshot_ids names {len(ids)}; each id is one line"
        )
    if len(set(ids)) != len(ids):
        found.problems.append(f"{name}: the manifest's fewshot_ids repeat an id; each names one line")
    found.ids = set(ids)
    return found
