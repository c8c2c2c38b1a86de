"""`quantize golden new OUT --from FILE --type TYPE`: a user's JSONL becomes a golden-set version.

One JSON object per line, of one item type (the templates of the kinds registry, quantize/kinds.py):

    multiple_choice  {"question": str, "choices": [str, ...], "answer": index or the right choice}
    greedy           {"context": str, "target": str}         right when the target is the greedy continuation
    perplexity       {"text": str}                            a document, scored token by token
    generate         {"prompt": str, "answer": str}           greedy generation until a stop sequence,
                                                              exact match after an optional regex
and optionally "id" (stable; default: <task>-<line>) and "cluster" (items that share one are not
independent; default: every item its own). The file is checked whole before anything is written:
the first bad line (not UTF-8, over 64 KiB, not a JSON object, a missing or empty field, a field of
another item type, an answer not among the choices, a duplicate id, a key written twice in one object) is
one message naming the line, exit 2, and no folder.
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
from quantize.golden.items import id_key
from quantize.golden.manifest import Manifest
from quantize.golden.version import TaskFiles, check_new_version, write_version
from quantize.io import user_lines
from quantize.kinds import Template, templates
from quantize.patterns import SlowPattern, compile_pattern, searched

MAX_LINE = 64 * 1024
MAX_FILE = 256 * 2**20
# --regex searched under a time limit (Generation.check_speed): over the first answers and over runs of RUN of
# one character then a NUL, on which a nested repetition backtracks through 2**RUN splits and a sound regex takes
# microseconds
SPEED_SECONDS = 5
MAX_SPEED_ANSWERS = 1000
RUN = 48
RUN_CHARACTERS = "a0 \n."

OPTIONAL = ("id", "cluster")


def template(kind: str) -> Template:
    """The template of a `--type` name (the kinds registry's, quantize/kinds.py); another name is a UsageError."""
    found = templates()
    if kind not in found or (t := found[kind].template) is None:
        raise UsageError(f"--type {kind!r} is no item type; choose one of {', '.join(found)}")
    return t


def fields(kind: str) -> tuple[str, ...]:
    return template(kind).fields


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
    for f in fields(kind):
        if f == "answer" and "choices" in fields(kind):
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
    own = fields(kind)
    if not isinstance(obj, dict):
        raise UsageError(f"{where} holds a JSON {type(obj).__name__}, not an object with {', '.join(own)}")
    if extra := sorted(set(obj) - set(own) - set(OPTIONAL)):
        other = [k for k in templates() if k != kind and set(extra) & set(fields(k))]
        what = f"fields of a {other[0]} item ({', '.join(extra)})" if other else f"unknown fields {', '.join(extra)}"
        raise UsageError(
            f"{where} has {what} in a {kind} file; every line must be a {kind} item with "
            f"{', '.join(own)} (and optionally id, cluster)"
        )
    if missing := [f for f in own if f not in obj]:
        raise UsageError(f"{where} lacks {', '.join(missing)}: a {kind} item has {', '.join(own)}")


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


class _DuplicateKey(Exception):
    """A key written twice in one JSON object (not a ValueError, which read_items reads as JSON that does not parse)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads's object_pairs_hook: an object, unless a key is written twice in it (json keeps the last, as
    PyYAML would, and the project's YAML loader refuses that too)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


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
                obj = json.loads(line, object_pairs_hook=_unique_keys)
            except _DuplicateKey as e:
                raise UsageError(
                    f"{where} writes the key {json.dumps(e.key)[:80]} twice in one object, and only the last would "
                    "count; keep one"
                ) from None
            except (ValueError, RecursionError) as e:
                raise UsageError(f"{where} is not valid JSON ({str(e)[:120]}); one JSON object per line") from None
            item = check_item(kind, obj, where)
            item.setdefault("id", f"{task}-{n:05d}")
            key = id_key(item["id"])  # as verify compares ids (NFC, stripped): "x" and "x\u00a0" are one id there
            if key in seen:
                raise UsageError(
                    f"{where}: id {item['id']!r} is already used on line {seen[key]} (ids are compared after Unicode "
                    "normalisation and trimming); ids must be unique"
                )
            seen[key] = n
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
        if not template(kind).generation and (self.regex is not None or self.stop):
            generating = [name for name, k in templates().items() if k.template and k.template.generation]
            raise UsageError(f"--regex and --stop apply to --type {' or '.join(generating)} only")
        if self.regex is not None and compile_pattern(self.regex, "--regex").groups > 1:
            raise UsageError(f"--regex {self.regex!r} has several groups; use one group around the answer, or none")
        if "" in self.stop:  # an empty stop sequence ends every answer before its first character
            raise UsageError("--stop '': a stop sequence is at least one character (the default stops at a newline)")
        if self.max_gen_toks < 1 or self.max_gen_toks > 4096:
            raise UsageError(f"--max-gen-toks {self.max_gen_toks}: give 1..4096 tokens")

    def check_speed(self, answers: list[str]) -> None:
        """lm-eval runs `regex` on every generated answer: one that backtracks exponentially (a repetition inside a
        repetition, (a+)+$) would hang every scoring of the set. It is searched, as a gguf recipe's tensor_types
        are (quantize/patterns.searched), over the items' answers (the first MAX_SPEED_ANSWERS) and over a run of
        each of its own characters and a few common ones, under SPEED_SECONDS; one that runs past is refused."""
        if self.regex is None:
            return
        runs = [c * RUN + "\0" for c in sorted(set(self.regex) | set(RUN_CHARACTERS))]
        try:
            searched([self.regex], runs + answers[:MAX_SPEED_ANSWERS], SPEED_SECONDS)
        except SlowPattern:
            raise UsageError(
                f"--regex {self.regex!r} took more than {SPEED_SECONDS} s to search a few short texts. A repetition "
                "inside a repetition (such as (a+)+ or (.*)*) backtracks exponentially on a text it does not match, "
                "and lm-eval runs the regex on every generated answer: write it without nested repetition (e.g. "
                "([0-9]+) in place of ([0-9]+)+); nothing was written"
            ) from None

    def argv(self, kind: str) -> list[str]:
        """The flags that rebuild this generation setting (the manifest's builder command)."""
        out = ["--regex", self.regex] if self.regex is not None else []
        for s in self.stop:
            out += ["--stop", s]
        return out + (["--max-gen-toks", str(self.max_gen_toks)] if template(kind).generation else [])


def new_version(
    out: Path, source: Path, kind: str, task: str | None = None, gen: Generation = Generation(), seed: int = 0
) -> Manifest:
    """Check the file whole, then write the version folder. Returns the manifest."""
    out = Path(out)
    shape = template(kind)  # an unknown --type: before anything else
    check_new_version(out)
    named = task is not None
    task = task or f"{out.parent.name}_{kind}"
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_\-]{0,63}", task):
        what = f"--task {task!r}" if named else f"the task name {task!r} (the set's folder name, then the type)"
        fix = "" if named else "; give --task NAME, or a set folder whose name starts with a letter"
        raise UsageError(f"{what}: a task name is a letter, then letters, digits, '_' or '-' (at most 64){fix}")
    gen.check(kind)
    items, digest = read_items(Path(source), kind, task)
    config = shape.config(gen.regex, list(gen.stop) or ["\n"], gen.max_gen_toks)
    gen.check_speed([str(it[config["doc_to_target"]]) for it in items[:MAX_SPEED_ANSWERS]] if shape.generation else [])
    clustered = "cluster" in items[0]
    tf = TaskFiles(
        name=task,
        output_type=templates()[kind].output_type,
        items=items,
        config=config,
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
