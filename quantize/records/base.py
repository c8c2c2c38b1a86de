"""What every record shares: `Record` (its `schema_version`, the names its messages use, whether it may hold
NaN or infinity, the most a file of it is read from), the names more than one record uses (outcomes and how a
rule's bounds decide one, the references to a checkpoint and a golden set, the agreement metrics), and the one
writer and reader of every record. A name one record alone uses lives in that record's module; a name two records
use lives here, so each record's module imports this one and no other record's (tests/test_layers.py)."""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from quantize.config import Wording, validate
from quantize.errors import RuntimeFailure, UsageError
from quantize.io import read_user_file, sha256_bytes, write_text_atomic

# One vocabulary for outcomes: a rule's, and the policy's as a whole.
RuleOutcome = Literal["pass", "regression", "inconclusive"]
GateOutcome = Literal["pass", "rejected", "inconclusive"]


# How a rule's bounds decide its outcome: the gate's one decision (quantize/stats.py noninferiority, the accuracy
# rules; quantize/gates/gate.py, the perplexity and agreement rules), kept beside the outcomes so that a verdict
# record is held to it (records/verdict.py) without a record importing the statistics.


def noninferiority_outcome(delta: float, lower: float, upper: float, margin: float) -> RuleOutcome:
    """A non-inferiority comparison's outcome from its estimate Δ and one-sided bounds (quantize/stats.py's module
    docstring): pass when the lower bound is above −m; a regression when the upper bound is below 0 and Δ below −m;
    else inconclusive. Bounds that are not finite give inconclusive here; the gate makes such evidence a regression
    (gates/gate.non_finite_is_regression), and a verdict record holds it to that."""
    if lower > -margin:
        return "pass"
    if upper < 0 and delta < -margin:
        return "regression"
    return "inconclusive"


def limit_outcome(
    lower: float, upper: float, at_most: float | None = None, at_least: float | None = None
) -> RuleOutcome:
    """An interval's outcome against a one-sided limit: `at_most` (a perplexity rule's max_ratio, a KL rule's max):
    pass when the upper bound is within it, a regression when the lower bound is beyond it; `at_least` (a top-1 or
    Σ min(p, q) rule's min): pass when the lower bound reaches it, a regression when the upper bound falls short;
    else inconclusive."""
    if (at_most is None) == (at_least is None):
        raise ValueError(f"a one-sided limit is at_most or at_least, not both or neither ({at_most}, {at_least})")
    if at_most is not None:
        return "pass" if upper <= at_most else "regression" if lower > at_most else "inconclusive"
    assert at_least is not None
    return "pass" if lower >= at_least else "regression" if upper < at_least else "inconclusive"


class Strict(BaseModel):
    """A model that refuses a key it does not name: every record, and every part of one."""

    model_config = ConfigDict(extra="forbid")


class OmitsUnset(Strict):
    """A part whose fields added later are left out of its JSON while None (OMITTED_WHEN_NONE), so a file that
    never set them keeps the bytes it had before they were added (and any sha256 pinned on them)."""

    OMITTED_WHEN_NONE: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _unset_omitted(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for field in self.OMITTED_WHEN_NONE:
            if data.get(field) is None:
                data.pop(field, None)
        return data


class Record(Strict):
    """A file the pipeline writes. Subclasses pin `schema_version` with a Literal."""

    WHAT: ClassVar[str] = "record"  # what the file is, for messages
    REGENERATE: ClassVar[str] = ""  # how to make a current one
    # evidence records (scores, agreement, verdicts) may hold what a broken checkpoint computed: NaN or ±inf,
    # written as the JSON strings "NaN", "Infinity", "-Infinity" and read back as floats; other records may not
    EVIDENCE: ClassVar[bool] = False
    # the most a file of this kind is read from (quantize/io.read_user_file): verdicts, run records and reports are
    # kilobytes to a few megabytes; a score file holds every item's record and may be hundreds of megabytes
    MAX_BYTES: ClassVar[int] = 64 * 2**20


R = TypeVar("R", bound=Record)


# --- names more than one record uses ----------------------------------------------------------------


class CheckpointRef(OmitsUnset):
    # a checkpoint whose stored values are all finite writes no non_finite_tensors: its files keep their bytes
    OMITTED_WHEN_NONE = ("non_finite_tensors",)

    path: str
    weights_sha256: str
    identity_sha256: str  # weights, config, tokenizer, chat template, generation defaults (checkpoint/files.py)
    # the tensors storing NaN or infinity (checkpoint/finite.non_finite_tensors: a GGUF's or safetensors files'):
    # non-finite evidence, which fails every rule of a gate on it (gates/gate.verdict_of) whatever its scores say;
    # None where none does
    non_finite_tensors: list[str] | None = None


class GoldenRef(Strict):
    name: str
    version: str
    path: str
    manifest_sha256: str
    task_version: float | str


class AgreementMetric(str, Enum):
    kl = "kl"  # mean KL(baseline ‖ candidate), top-k lower bound
    top1 = "top1"  # share of positions with the same most likely token
    sum_min = "sum_min"  # Σ min(p, q): acceptance rate as a draft for the baseline


# --- reading and writing ---------------------------------------------------------------------------


def to_json(record: Record) -> str:
    """The record as JSON. JSON has no NaN or infinity: an evidence record (scores, agreement, a verdict) writes
    them as the strings "NaN", "Infinity", "-Infinity", which read back as floats; in any other record a
    non-finite number is a RuntimeFailure naming the field (our bug, exit 3)."""
    data = record.model_dump()
    if record.EVIDENCE:
        data = finite_or_named(data)
    try:
        return json.dumps(data, indent=2, default=str, allow_nan=False) + "\n"
    except ValueError:
        raise RuntimeFailure(
            f"{record.WHAT}: {', '.join(non_finite_fields(data)) or 'a value'} is not a finite number, which no record "
            "may hold; report this as a bug with the command that wrote it"
        ) from None


def finite_or_named(data: Any) -> Any:
    """JSON-ready data with each non-finite float replaced by its JSON string name."""
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, dict):
        return {k: finite_or_named(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite_or_named(v) for v in data]
    return data


def non_finite_fields(data: Any, at: str = "") -> list[str]:
    """Dotted paths of every NaN or infinite float in parsed JSON-like data."""
    if isinstance(data, float):
        return [] if math.isfinite(data) else [at or "(the record)"]
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in non_finite_fields(v, f"{at}.{k}" if at else str(k))]
    if isinstance(data, list | tuple):
        return [p for i, v in enumerate(data) for p in non_finite_fields(v, f"{at}.{i}")]
    return []


def write(path: Path, record: Record) -> str:
    """The one writer of every record: JSON through a temporary file and an atomic rename. Returns the sha256 of
    the bytes written (a cache entry's digest, without reading the file back)."""
    text = to_json(record)
    write_text_atomic(Path(path), text)
    return sha256_bytes(text.encode("utf-8"))


def parse(model: type[R], data: Any, origin: str) -> R:
    """Validate parsed JSON as a record; another schema version, or a file from before versions, is refused."""
    what, hint = model.WHAT, model.REGENERATE
    if not isinstance(data, dict):
        raise UsageError(f"{origin} is not a {what}: it holds a JSON {type(data).__name__}, not an object; {hint}")
    version = data.get("schema_version")
    expected = model.model_fields["schema_version"].default
    if version != expected:
        found = (
            "no schema_version (it was written before records were versioned)"
            if version is None
            else f"schema_version {json.dumps(version)[:20]}"
        )
        raise UsageError(f"{origin} is a {what} with {found}; this quantize reads schema_version {expected}: {hint}")
    return validate(model, data, origin, what, Wording(regenerate=hint))


def read(model: type[R], path: Path) -> R:
    """The one reader of every record: a regular file of at most the kind's `MAX_BYTES` (a FIFO or a device named
    as a verdict or a score file is refused without being read; quantize/io.read_user_file)."""
    path = Path(path)
    return loads(model, read_user_file(path, model.WHAT, model.MAX_BYTES, hint=model.REGENERATE), path)


def loads(model: type[R], raw: bytes, path: Path) -> R:
    """A record from the bytes of its file (for a reader that also hashes them: one read)."""
    try:
        data = json.loads(raw.decode("utf-8"))  # strictly: json.loads(bytes) also takes UTF-16 and UTF-32
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: bad JSON, or an over-long integer
        raise UsageError(f"{path} is not a {model.WHAT}: not valid JSON ({str(e)[:200]}); {model.REGENERATE}") from None
    return parse(model, data, str(path))
