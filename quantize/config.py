"""Loading the YAML files users edit (recipes, suites, gate policies) into validated schemas.

Every problem is reported at once, each naming the field, the bad value and what is wrong, as a
UsageError (exit code 2) before any heavy work starts. Booleans are YAML 1.2's: `streaming: on` is the word on,
`true` and `false` are booleans (`_Loader`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from quantize.errors import UsageError
from quantize.io import decode_text, read_user_file, sha256_bytes

M = TypeVar("M", bound=BaseModel)

# Limits on the YAML users edit: a recipe, suite or policy is a few hundred bytes of plain mappings.
MAX_YAML_BYTES = 1_000_000
MAX_DEPTH = 32
MAX_NODES = 10_000  # values, keys and collections in one file; parsing stops at the first past it (a 60,000-entry
# list took 1.6 s to parse before any schema could refuse it)


BOOL_TAG = "tag:yaml.org,2002:bool"
# YAML 1.2's core schema: only true and false are booleans. YAML 1.1 (PyYAML's default) also reads yes/no/on/off in
# any case as booleans, so `streaming: on`, as the docs and the messages write it, would arrive as True
CORE_BOOLEANS = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


def _core_resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    """SafeLoader's implicit resolvers with its YAML 1.1 booleans replaced by the core schema's."""
    out = {
        first: [(tag, rx) for tag, rx in rules if tag != BOOL_TAG]
        for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for first in "tTfF":
        out.setdefault(first, []).insert(0, (BOOL_TAG, CORE_BOOLEANS))
    return {first: rules for first, rules in out.items() if rules}


class _Loader(yaml.SafeLoader):
    """SafeLoader without aliases (a few hundred bytes of nested aliases expand to gigabytes), with a depth
    limit (deep nesting exhausts the parser's recursion), a limit on the values in one file, and YAML 1.2's
    booleans: `on`, `off`, `yes` and `no` are text (`streaming: on`), `true` and `false` booleans. A schema's
    boolean field still takes on/off and yes/no (pydantic reads those words as booleans)."""

    yaml_implicit_resolvers = _core_resolvers()
    UNIQUE_KEYS = True  # a key twice in one mapping is refused (PyYAML keeps the last: `rules:` twice lost the first)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if self.UNIQUE_KEYS and isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the constructor below refuses it
                    continue
                if first is not None:
                    raise UsageError(
                        f"the key {_shown(key)} is written twice in one mapping (lines {first} and "
                        f"{key_node.start_mark.line + 1}), and only one of them would count; keep one"
                    )
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise UsageError(f"YAML aliases (*name) are not accepted here (line {mark.line + 1}); write the value out")
        self._nodes = getattr(self, "_nodes", 0) + 1
        if self._nodes > MAX_NODES:
            mark = self.peek_event().start_mark
            raise UsageError(
                f"YAML with more than {MAX_NODES:,} values (line {mark.line + 1}); a recipe, suite, policy or sweep "
                "holds a few hundred: split it"
            )
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise UsageError(
                    f"YAML nested deeper than {MAX_DEPTH} levels (line {mark.line + 1}); these files are flat mappings"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Yaml11Loader(_Loader):
    """The same limits with YAML 1.1's booleans, for a file another tool reads as YAML 1.1 (a model card's front
    matter, which huggingface_hub reads with yaml.safe_load): `inference: no` keeps the meaning it has there."""

    yaml_implicit_resolvers = yaml.SafeLoader.yaml_implicit_resolvers
    UNIQUE_KEYS = False  # as yaml.safe_load reads it (the last of a key written twice counts)


def parse_yaml(raw: bytes, origin: str, *, yaml11_booleans: bool = False) -> Any:
    """Parse YAML text with the limits above; every failure is a UsageError naming the file. Booleans are YAML
    1.2's (`_Loader`), or with `yaml11_booleans` YAML 1.1's, for files another tool reads (`_Yaml11Loader`)."""
    if len(raw) > MAX_YAML_BYTES:
        raise UsageError(f"{origin} is {len(raw):,} bytes; a recipe, suite or policy is at most {MAX_YAML_BYTES:,}")
    text = decode_text(raw, origin)
    try:
        return yaml.load(text, Loader=_Yaml11Loader if yaml11_booleans else _Loader)
    except yaml.YAMLError as e:
        raise UsageError(f"{origin} is not valid YAML: {e}") from None
    except UsageError as e:  # a limit of _Loader's
        raise UsageError(f"{origin}: {e}") from None
    except (ValueError, RecursionError) as e:  # e.g. an integer of more than 4,300 digits
        raise UsageError(f"{origin} holds a value YAML cannot read: {str(e)[:200]}") from None


def _message(err: dict[str, Any], skip: set[str], tag_label: str, hints: dict[str, str]) -> str:
    tags = [str(x) for x in err["loc"] if str(x) in skip]
    loc = tuple(x for x in err["loc"] if str(x) not in skip)
    field = ".".join(str(x) for x in loc) or "(top level)"
    kind, msg = err["type"], err["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden" and tags and tag_label and field in hints:
        return f"`{field}` is not a setting of {tag_label.format(tags[-1])} ({hints[field]}): remove it"
    if kind == "extra_forbidden":
        return f"unknown key `{field}`: there is no such field; check its spelling against the shipped examples"
    if kind == "missing":
        return f"`{field}` is required"
    if not loc:
        return msg
    shown = _shown(err.get("input"))
    return f"{field} = {shown}: {msg}"


def _shown(value: Any) -> str:
    """A value for a message, bounded: containers are not serialised (they may be huge)."""
    if isinstance(value, dict):
        return "{...}"
    if isinstance(value, (list, tuple)):
        return "[...]"
    if isinstance(value, str):
        return json.dumps(value[:80] + ("…" if len(value) > 80 else ""))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**40:
        return "a very large integer"
    return json.dumps(value, default=str)[:80]


@dataclass(frozen=True)
class Wording:
    """How a schema's errors are worded: `skip_locs` are union tags left out of field names; `tag_label` (e.g.
    "method {}") names the tag when a key does not belong to it; `regenerate` says how to make a good file;
    `hints` map a key to the fix when it sits in the wrong place."""

    skip_locs: frozenset[str] = frozenset()
    tag_label: str = ""
    regenerate: str = ""
    hints: dict[str, str] = field(default_factory=dict)


def validate(model: type[M] | TypeAdapter, data: Any, origin: str, what: str, wording: Wording = Wording()) -> M:
    """Validate a parsed mapping against a model (or a TypeAdapter of a union); raise one UsageError
    listing every problem, worded as `wording` says."""
    if not isinstance(data, dict):
        raise UsageError(f"{origin}: a {what} is a YAML mapping of keys to values, got {type(data).__name__}")
    adapter = model if isinstance(model, TypeAdapter) else TypeAdapter(model)
    try:
        return adapter.validate_python(data)
    except ValidationError as e:
        w = wording
        problems = [_message(err, set(w.skip_locs), w.tag_label, w.hints) for err in e.errors()]
        tail = f"\n{w.regenerate[0].upper()}{w.regenerate[1:]}." if w.regenerate else ""
        raise UsageError(
            f"{origin} is not a valid {what}:\n" + "\n".join(f"  - {p}" for p in problems) + tail
        ) from None


def load_yaml(
    path: str | Path, model: type[M] | TypeAdapter, what: str, hint: str, wording: Wording = Wording()
) -> tuple[M, str]:
    """Read, parse and validate a YAML file. Returns the model and the sha256 of the file's bytes."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} file {p} is a folder: pass the .yaml file inside it; {hint}")
    raw = read_user_file(p, f"{what} file", MAX_YAML_BYTES, hint=hint)
    data = parse_yaml(raw, str(p))
    return validate(model, data, str(p), what, wording), sha256_bytes(raw)


def beside_repo(config_file: str | Path, relative: str) -> str:
    """A path named inside a YAML file, resolved against that file's own location only (never the
    current folder): its folder, then the repository holding it (recipes/, evaluate/ and gates/ sit
    beside golden/). Absolute paths are kept."""
    p = Path(relative)
    if p.is_absolute():
        return relative
    here = Path(config_file).resolve().parent
    for base in (here, here.parent):
        if (base / p).exists():
            return str(base / p)
    return str(here.parent / p)
