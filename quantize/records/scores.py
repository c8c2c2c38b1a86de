"""A score file ($QUANTIZE_CACHE/scores/*.json, `quantize eval --json`), written by `quantize eval`: one
checkpoint scored on one suite, each task's summary and per-item records (one item type per output kind,
quantize/kinds.py), and the provenance that keys them."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from quantize.records.base import CheckpointRef, GoldenRef, OmitsUnset, Record, Strict, non_finite_fields


class SuiteRef(Strict):
    path: str
    name: str | None
    sha256: str  # of the score-changing settings
    settings: dict[str, Any]


class ScoreProvenance(OmitsUnset):
    # a side scored here writes neither samples field, and one that rounds no activations neither machine field:
    # its score file keeps the bytes (and the sha256 a policy may pin: baseline_scores_sha256) it had before them
    OMITTED_WHEN_NONE = ("samples", "model_args", "cpu", "threads")

    checkpoint: CheckpointRef
    suite: SuiteRef
    golden: GoldenRef
    task_versions: dict[str, float | str]
    lm_eval_version: str
    batch_size: int
    seed: int
    backend: str
    device: str
    dtype: str
    trust_remote_code: bool = False  # the checkpoint's own code ran at load (asked for on the command line)
    engine: str | None = None  # another engine than transformers (a GGUF's llama.cpp: version, threads, n_batch)
    # a model that rounds activations, scored on a CPU: the CPU's name and torch's thread count (keyed by both:
    # quantize/evaluate/cache.py Runtime.rounding)
    cpu: str | None = None
    threads: int | None = None
    # a side read from lm-eval's own samples (quantize/evaluate/samples.py), not scored here: every file read (the
    # results file and each task's samples file) with its sha256, and lm-eval's model arguments as written
    samples: dict[str, str] | None = None
    model_args: str | None = None


# a log-likelihood is the log of a probability, at most 0: a figure above it is a file edited or an engine's sign
# flipped (a perplexity ratio of 0 passed a gate), never float rounding (a thousandth of a nat is far above it)
LL_SLACK = 1e-3


def log_probability(v: float) -> float:
    """v, a log-likelihood: at most 0 (LL_SLACK), or NaN / −∞ (non-finite evidence, a regression)."""
    if v > LL_SLACK:
        raise ValueError(f"a log-likelihood is the log of a probability, at most 0; got {v}")
    return v


def right_or_wrong(v: float) -> float:
    """v, a right/wrong item's score: 0 or 1 (NaN: non-finite evidence)."""
    if not math.isnan(v) and v not in (0.0, 1.0):
        raise ValueError(f"a right/wrong item scores 0 or 1; got {v}")
    return v


class _Item(Strict):
    id: str
    cluster: str
    score: float  # 0/1 for right/wrong items; the log-likelihood for documents
    ll: float  # log p(gold | context), or log p(document)
    # lm-eval's per-item values of the task's other metrics, as lm-eval names them: acc_norm; exact_match@FILTER
    # for each filter pipeline but the "none" one (quantize/kinds.py, item_metrics)
    metrics: dict[str, float] = Field(default_factory=dict)
    prompt_sha256: str | None = None  # lm-eval's hash of the item's (first) prompt: both sides must have the same
    # the hash of the token ids our engine scored (quantize/evaluate/engine.ScoredTokens); None where the file
    # predates it (before 2026-12-07), or lm-eval's HFLM, vLLM or samples computed the item
    tokens_sha256: str | None = None

    _ll = field_validator("ll")(log_probability)

    @property
    def units(self) -> int:
        """What a perplexity is per: one target for a context/target item."""
        return 1


class ChoiceItem(_Item):
    lls: list[float]  # log-likelihood of every choice

    _right = field_validator("score")(right_or_wrong)

    @field_validator("lls")
    @classmethod
    def _lls(cls, v: list[float]) -> list[float]:
        for x in v:
            log_probability(x)
        return v


class GreedyItem(_Item):
    _right = field_validator("score")(right_or_wrong)


class DocumentItem(_Item):
    words: int = Field(ge=1)
    bytes: int = Field(ge=1)

    _document = field_validator("score")(log_probability)  # a document's score is its log-likelihood

    @property
    def units(self) -> int:
        return self.words


class GenerationItem(OmitsUnset):
    # a file that predates generated_ll keeps its bytes (OmitsUnset)
    OMITTED_WHEN_NONE = ("generated_ll",)

    id: str
    cluster: str
    score: float  # exact match (0/1) of the filtered response
    response: str  # the response after the task's filters, cut at 200 characters
    metrics: dict[str, float] = Field(default_factory=dict)  # as _Item's: exact_match@strict-match, ...
    prompt_sha256: str | None = None
    tokens_sha256: str | None = None  # as _Item's
    # Σ log p(each generated token | prompt and the tokens before it), from the logits that chose it (our engines,
    # quantize/evaluate/engine.ScoredTokens): finite for any model whose logits are, NaN or infinite where a step's
    # logits were not (a broken checkpoint: its response is no answer, and the item is non-finite evidence, as a
    # NaN log-likelihood is). None where the file predates it (scorer revision 10, llama.cpp's 3), or lm-eval's
    # HFLM, vLLM or samples computed the item
    generated_ll: float | None = None

    _right = field_validator("score")(right_or_wrong)
    _ll = field_validator("generated_ll")(lambda v: v if v is None else log_probability(v))


class _AccuracyTask(Strict):
    version: float | str
    n: int
    acc: float
    acc_se: float | None  # None for a single item: no estimate
    chance: float
    mean_ll: float
    metrics: dict[str, float] = Field(default_factory=dict)  # the mean of each per-item metric
    lm_eval: dict[str, float]


class ChoiceTask(_AccuracyTask):
    output_type: Literal["multiple_choice"] = "multiple_choice"
    items: list[ChoiceItem]


class GreedyTask(_AccuracyTask):
    output_type: Literal["loglikelihood"] = "loglikelihood"
    items: list[GreedyItem]


class RollingTask(Strict):
    output_type: Literal["loglikelihood_rolling"] = "loglikelihood_rolling"
    version: float | str
    n: int
    bits_per_byte: float
    word_perplexity: float
    lm_eval: dict[str, float]
    items: list[DocumentItem]


class GenerationTask(Strict):
    """A generate_until task: greedy generation, the task's filters, exact match per item."""

    output_type: Literal["generate_until"] = "generate_until"
    version: float | str
    n: int
    acc: float  # exact-match rate
    acc_se: float | None
    filter: str  # the filter pipeline whose output was matched (the task's first)
    metrics: dict[str, float] = Field(default_factory=dict)  # the mean of each per-item metric
    lm_eval: dict[str, float]
    items: list[GenerationItem]


TaskScores = Annotated[ChoiceTask | GreedyTask | RollingTask | GenerationTask, Field(discriminator="output_type")]


class ScoreDoc(Record):
    """One checkpoint scored on one suite: task summaries, per-item records and the provenance that keys them."""

    WHAT: ClassVar[str] = "score file"
    EVIDENCE: ClassVar[bool] = True
    MAX_BYTES: ClassVar[int] = 512 * 2**20
    REGENERATE: ClassVar[str] = (
        "write a current one with `quantize eval SUITE CHECKPOINT --json --items` (add --refresh to score again)"
    )

    # 2: the checkpoint's identity covers its config and tokenizer, not only its weights (version 1
    # cannot be migrated: the files it was scored with are not recorded)
    schema_version: Literal[2] = 2
    key: str
    provenance: ScoreProvenance
    created: str
    wall_seconds: float
    tasks: dict[str, TaskScores]

    def summary(self) -> dict[str, Any]:
        """The document without per-item records (`quantize eval --json` without --items), with the ids of items
        whose numbers are not finite per task (`non_finite`)."""
        d = self.model_dump()
        bad = self.non_finite()
        for name, t in d["tasks"].items():
            t.pop("items")
            t["non_finite"] = bad.get(name, [])
        return d

    def non_finite(self) -> dict[str, list[str]]:
        """task -> ids of the items holding a NaN or infinite score or log-likelihood (a broken checkpoint)."""
        return {name: ids for name, t in self.tasks.items() if (ids := non_finite_items(t))}


def non_finite_items(task: TaskScores) -> list[str]:
    """Ids of one task's items holding a NaN or infinite number (read from the items' own fields: no dump)."""
    return [i.id for i in task.items if non_finite_fields(vars(i))]
