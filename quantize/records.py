"""The records the pipeline writes and reads: typed and versioned, each written whole by `write` (never patched
by key) and read back through its model by `read`.

    RunRecord        CHECKPOINT/quantize.json                    written by `quantize run`
    ScoreDoc         $QUANTIZE_CACHE/scores/*.json, eval --json  written by `quantize eval` (per-item records)
    AgreementResult  $QUANTIZE_CACHE/agreement/cmp-*.json        written by the agreement scorer
    Verdict          gate --json, CANDIDATE/gate.json            written by `quantize gate` (VERDICT_FILE: the name
                                                                 a verdict saved beside its candidate takes)
    SearchReport     OUTPUT/search.json                          written by `quantize search`, which also reads the
                                                                 winner's RunRecord and writes it again with its
                                                                 `search` reference
    SensitivityRecord $QUANTIZE_CACHE/search/sensitivity-*.json  written by `quantize search`
    SweepRecord      OUTPUT/sweep-NAME/sweep.json                written by `quantize sweep` (every task and attempt)

Every record carries `schema_version`; `read` refuses a file of another version, or with an unknown or
missing key, as a UsageError (exit 2) that names the file and says how to regenerate it. Records are
plain data (no paths objects, no numpy): `model_dump()` is exactly the JSON that is written.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quantize.errors import RuntimeFailure, UsageError

# One vocabulary for outcomes: a rule's, and the policy's as a whole.
RuleOutcome = Literal["pass", "regression", "inconclusive"]
GateOutcome = Literal["pass", "rejected", "inconclusive"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Record(_Strict):
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


# --- quantize.json ---------------------------------------------------------------------------------


class RecipeRef(_Strict):
    path: str
    sha256: str
    resolved: dict[str, Any]
    resolved_sha256: str


class SourceModel(_Strict):
    path: str
    weights_sha256: str
    parameters: int | None


class TokenSpread(_Strict):
    """Tokens per document over the documents a calibration packed (the last one may be packed in part)."""

    min: int
    median: float
    max: int
    total: int


class CalibrationSourceRecord(_Strict):
    """One source of a calibration: what it is, how it was read and what it gave."""

    source: str  # as the recipe gives it
    description: str
    kind: Literal["text", "chat"]  # chat: conversations rendered through the checkpoint's chat template
    field: str | None  # the column (JSONL key) read; None for .txt and the built-in text
    weight: float
    samples: int  # packed rows taken from it
    documents_used: int


class VocabularyOverlap(_Strict):
    """How much of a golden set's vocabulary the calibration tokens hold: its items' prompts (doc_to_text) tokenized
    by the checkpoint's tokenizer, each token id looked up among the packed calibration ids."""

    golden: str
    tasks: list[str]
    distinct_tokens: int  # distinct token ids in the golden items
    distinct_share: float  # of those, the share found in the calibration
    token_share: float  # of the golden items' token occurrences, the share whose id is found in the calibration


class CalibrationRecord(_Strict):
    source: str  # "mixture" for a mixture (its sources in `sources`)
    description: str
    samples: int
    seq_len: int
    seed: int
    documents_used: int
    tokens: int  # packed: samples × seq_len
    token_sha256: str
    # what the calibration saw (absent in records written before 2026-12-03)
    sources: list[CalibrationSourceRecord] = Field(default_factory=list)
    document_tokens: TokenSpread | None = None
    chat_template_sha256: str | None = None  # of the template that rendered the conversations
    # tokens the chat template added: rendered minus each message's content tokenized alone, over the documents used
    chat_template_tokens: int | None = None
    chat_template_share: float | None = None  # chat_template_tokens / document_tokens.total
    overlap: VocabularyOverlap | None = None  # with the golden set the recipe's calibration.overlap_with names


class ExpertRouting(_Strict):
    """One MoE layer's calibration: the tokens that passed through it and how many of them its router sent to
    each expert (top-k selections, counted by hooks during calibration); with `all_experts_calibrated` every
    expert's calibration statistics came from all `tokens` (llm-compressor's moe_calibrate_all_experts), the
    routed counts say how often each expert is used."""

    module: str  # the experts module, e.g. model.layers.1.mlp.experts
    tokens: int
    top_k: int
    routed_tokens: list[int]  # per expert, in expert order; sums to tokens × top_k
    all_experts_calibrated: bool


class LeftAt16(_Strict):
    """Weights the recipe's targets cover that the saved checkpoint stores at 16 bits, for one reason."""

    why: str
    tensors: list[str]
    bytes: int


class LayerPlanRecord(_Strict):
    quantized_layers: int
    by_group_size: dict[str, int]  # "per-channel" or the group size -> number of layers
    adjusted: dict[str, int]  # layers given a smaller group than the recipe's -> their group
    kept_16bit: dict[str, str]  # layer -> why it stayed at 16 bits
    schemes: dict[str, int] = Field(default_factory=dict)  # overrides: scheme -> number of layers given it
    # what the saved checkpoint stores at 16 bits of what the targets cover (routers and layers the plan keeps,
    # fused experts no conversion reaches, a planned layer the backend did not quantize), by reason
    left_16bit: list[LeftAt16] = Field(default_factory=list)
    routing: list[ExpertRouting] = Field(default_factory=list)  # per MoE layer, from calibration (none: data-free)


class EngineRecord(_Strict):
    backend: str
    # what ran: llm-compressor's recipe YAML (Recipe.create_instance loads it back), or the other backend's
    # description; a list of repr() strings in records written before 2026-12-03
    modifiers: str | list[str]
    calibration_dtype: str
    saved_dtype: str
    calibration_dtype_reason: str = ""  # why that dtype (dtypes.calibration_dtype); empty in older records


class MemoryRecord(_Strict):
    peak_rss_bytes: int
    peak_accelerator_bytes: int | None


class MemoryPlanRecord(_Strict):
    """The memory plan made before the model was loaded (convert/memory.py): the path taken, what it was estimated
    to hold at its peak (terms, bytes) against what was available, and which reload check ran."""

    path: Literal["in-memory", "offloaded", "streamed"]
    need_bytes: int
    available_bytes: int | None  # None: the machine did not say (no /proc/meminfo) and nothing was given
    available_from: str  # --max-memory, recipe max_memory, MemAvailable, unknown
    terms: dict[str, int]  # what the conversion holds at its peak, by name
    # each phase's need, need_bytes the largest: the conversion (the sum of terms) and the check of its output after
    # it (full reload check or streamed checks); none in a record written before the check was planned as a phase
    phases: dict[str, int] = Field(default_factory=dict)
    model_bytes: int
    largest_shard_bytes: int
    largest_layer_bytes: int
    activation_bytes: int
    output_bytes_estimate: int
    workers: int
    # full: the output reloaded with transformers and its logits checked; streamed: its tensors read one at a
    # time (all finite) and its headers checked against the model's structure, because the model would not fit
    reload: Literal["full", "streamed"]


class FiniteCheck(_Strict):
    stage: str
    rows: int
    tokens: int
    finite: bool
    max_abs_logit: float | None  # None for the streamed check, which reads tensors and computes no logits
    tensors_read: int | None = None  # the streamed check: how many stored tensors it read (None: a logits check)


class ModuleBits(_Strict):
    module: str
    format: str
    bytes: int
    parameters: int
    roles: dict[str, int]
    bits_per_weight: float | None


class BitsRecord(_Strict):
    total_bytes: int
    source_parameters: int | None
    bits_per_weight: float | None  # 8 × total_bytes / source_parameters
    quantized_linear_bits_per_weight: float | None
    quantized_linear_parameters: int
    bytes_by_role: dict[str, int]
    format: str
    modules: list[ModuleBits]
    notes: list[str]


class SearchRef(_Strict):
    """In the quantize.json of a checkpoint `quantize search` chose: where the search is recorded."""

    spec: str  # the search recipe's path
    spec_sha256: str
    report: str  # search.json beside quantize.json
    try_index: int
    options: dict[str, int]  # option -> layer groups given it
    holdout_kl: float


class RunRecord(Record):
    """CHECKPOINT/quantize.json: what was run, on what, with which libraries, and the true bits."""

    WHAT: ClassVar[str] = "quantize.json run record"
    REGENERATE: ClassVar[str] = "run `quantize run RECIPE --force` to rewrite the checkpoint"

    schema_version: Literal[1] = 1
    created: str
    recipe: RecipeRef
    method: str
    scheme: str | None
    source_model: SourceModel
    weights_sha256: str
    calibration: CalibrationRecord | None
    seed: int
    layer_plan: LayerPlanRecord
    engine: EngineRecord
    versions: dict[str, str | None]
    time_seconds: dict[str, float]
    memory: MemoryRecord
    finite_checks: list[FiniteCheck]
    bits: BitsRecord
    search: SearchRef | None = None  # set when `quantize search` chose this checkpoint
    memory_plan: MemoryPlanRecord | None = None  # None in records written before the plan existed (2026-12-03)

    @property
    def label(self) -> str:
        return str(self.recipe.resolved.get("name") or Path(self.source_model.path).name)


# --- scores ----------------------------------------------------------------------------------------


class CheckpointRef(_Strict):
    path: str
    weights_sha256: str
    identity_sha256: str  # weights, config, tokenizer, chat template, generation defaults (checkpoint.py)


class SuiteRef(_Strict):
    path: str
    name: str | None
    sha256: str  # of the score-changing settings
    settings: dict[str, Any]


class GoldenRef(_Strict):
    name: str
    version: str
    path: str
    manifest_sha256: str
    task_version: float | str


class ScoreProvenance(_Strict):
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


class _Item(_Strict):
    id: str
    cluster: str
    score: float  # 0/1 for right/wrong items; the log-likelihood for documents
    ll: float  # log p(gold | context), or log p(document)
    # lm-eval's per-item values of the task's other metrics, as lm-eval names them: acc_norm; exact_match@FILTER
    # for each filter pipeline but the "none" one (quantize/kinds.py, item_metrics)
    metrics: dict[str, float] = Field(default_factory=dict)
    prompt_sha256: str | None = None  # lm-eval's hash of the item's (first) prompt: both sides must have the same

    @property
    def units(self) -> int:
        """What a perplexity is per: one target for a context/target item."""
        return 1


class ChoiceItem(_Item):
    lls: list[float]  # log-likelihood of every choice


class GreedyItem(_Item):
    pass


class DocumentItem(_Item):
    words: int
    bytes: int

    @property
    def units(self) -> int:
        return self.words


class GenerationItem(_Strict):
    id: str
    cluster: str
    score: float  # exact match (0/1) of the filtered response
    response: str  # the response after the task's filters, cut at 200 characters
    metrics: dict[str, float] = Field(default_factory=dict)  # as _Item's: exact_match@strict-match, ...
    prompt_sha256: str | None = None


class _AccuracyTask(_Strict):
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


class RollingTask(_Strict):
    output_type: Literal["loglikelihood_rolling"] = "loglikelihood_rolling"
    version: float | str
    n: int
    bits_per_byte: float
    word_perplexity: float
    lm_eval: dict[str, float]
    items: list[DocumentItem]


class GenerationTask(_Strict):
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


# --- sizing ----------------------------------------------------------------------------------------


class AccuracySizing(_Strict):
    """A right/wrong task's flips between two checkpoints and what its size can resolve (gates/sizing.py)."""

    kind: Literal["right/wrong"] = "right/wrong"
    task: str
    metric: str = "acc"  # the kind's own score, or a per-item metric of the task (acc_norm, exact_match@FILTER)
    n: int
    clusters: int
    flip_rate: float
    right_to_wrong: int
    wrong_to_right: int
    delta: float
    se: float
    min_detectable_drop: float
    items_needed: int | float  # a count, or inf where no number of items would resolve the margin


class PerplexitySizing(_Strict):
    kind: Literal["perplexity"] = "perplexity"
    task: str
    n: int
    clusters: int
    ratio: float
    upper_bound: float
    half_width: float  # u / r − 1 of the gate's bootstrap bound
    documents_needed: int


class SizingReport(Record):
    """`quantize golden size --json`: per task, what a pair of checkpoints says about the set's size."""

    WHAT: ClassVar[str] = "sizing report"
    REGENERATE: ClassVar[str] = "run `quantize golden size SUITE --baseline B --candidate C --json` again"
    EVIDENCE: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    golden: str
    baseline: str
    candidate: str
    margin: float
    alpha: float
    power: float
    ppl_half_width: float
    tasks: list[Annotated[AccuracySizing | PerplexitySizing, Field(discriminator="kind")]]


# --- agreement -------------------------------------------------------------------------------------


class AgreementMetric(str, Enum):
    kl = "kl"  # mean KL(baseline ‖ candidate), top-k lower bound
    top1 = "top1"  # share of positions with the same most likely token
    sum_min = "sum_min"  # Σ min(p, q): acceptance rate as a draft for the baseline


class AgreementResult(Record):
    """Token-distribution agreement of a candidate with its baseline's stored top-k."""

    WHAT: ClassVar[str] = "agreement result"
    EVIDENCE: ClassVar[bool] = True
    REGENERATE: ClassVar[str] = "delete it; the next `quantize gate` computes it again"

    # 2: keyed by checkpoint identities (weights, config, tokenizer); 1 and unversioned files named
    # weights only, so they cannot be migrated
    schema_version: Literal[2] = 2
    positions: int
    items: int
    clusters: int
    kl_mean: float
    kl_se: float
    kl_p99: float
    top1: float
    top1_se: float
    sum_min: float
    sum_min_se: float
    note: str
    baseline_identity: str
    candidate_identity: str
    top_k: int
    per_task: int
    tasks: list[str]

    def estimate(self, metric: AgreementMetric) -> tuple[float, float]:
        """(value, clustered SE) of one metric."""
        return {
            AgreementMetric.kl: (self.kl_mean, self.kl_se),
            AgreementMetric.top1: (self.top1, self.top1_se),
            AgreementMetric.sum_min: (self.sum_min, self.sum_min_se),
        }[metric]


# --- verdict ---------------------------------------------------------------------------------------


# A verdict saved beside its candidate, and its JUnit XML: the names `make gate-all`, a sweep's and a search's gates
# and the GitHub Action write, and that the report and a sweep's resume read (a Verdict, read through this model).
VERDICT_FILE = "gate.json"
JUNIT_FILE = "gate.xml"


class AccuracyEvidence(_Strict):
    n: int
    clusters: int
    baseline: float
    candidate: float
    delta: float
    se_paired: float
    se_clustered: float
    se: float
    lower_bound: float
    upper_bound: float
    margin: float
    alpha: float
    flips_right_to_wrong: int
    flips_wrong_to_right: int
    mcnemar_p: float
    examples_right_to_wrong: list[str]
    min_detectable_drop: float
    items_needed: int | float | None  # float only for inf (no variance estimate)
    items_needed_at_estimate: int | float | None


class PerplexityEvidence(_Strict):
    n: int
    clusters: int
    baseline_perplexity: float
    candidate_perplexity: float
    ratio: float
    lower_bound: float
    upper_bound: float
    max_ratio: float
    alpha: float
    interval: str


class AgreementEvidence(_Strict):
    value: float
    se_clustered: float
    lower_bound: float
    upper_bound: float
    max: float | None = None
    min: float | None = None
    alpha: float
    positions: int
    items: int
    clusters: int
    kl_p99: float | None = None
    note: str


class _RuleResult(_Strict):
    rule: str  # its label: the policy's `name:` or "<task> <metric>"
    verdict: RuleOutcome
    p_regression: float | None = None
    p_holm: float | None = None
    # sequential gate: the look (1-based) that decided it, or the last one taken (an agreement rule: its agreement
    # look; None: agreement measured once)
    look: int | None = None
    # set when the candidate's evidence held NaN or infinity: the rule is a regression whatever its statistics say
    non_finite: str | None = None


class AccuracyResult(_RuleResult):
    kind: Literal["accuracy"] = "accuracy"
    task: str
    metric: str | None = None  # the per-item metric compared (acc, acc_norm, exact_match@FILTER); None: written before
    evidence: AccuracyEvidence


class PerplexityResult(_RuleResult):
    kind: Literal["perplexity"] = "perplexity"
    task: str
    metric: str | None = None  # perplexity, word_perplexity, byte_perplexity; None: written before
    evidence: PerplexityEvidence


class AgreementRuleResult(_RuleResult):
    kind: Literal["agreement"] = "agreement"
    metric: AgreementMetric
    evidence: AgreementEvidence


class UntestedResult(_Strict):
    """A rule a sequential gate never tested: it stopped at a regression found before the rule's task was
    scored (an agreement rule, measured before the first look). No evidence, no p-value: the verdict is
    settled by the regression, whatever this rule would have said."""

    kind: Literal["untested"] = "untested"
    rule: str
    task: str
    verdict: Literal["untested"] = "untested"
    reason: str
    p_regression: None = None
    p_holm: None = None
    look: None = None


RuleResult = Annotated[
    AccuracyResult | PerplexityResult | AgreementRuleResult | UntestedResult, Field(discriminator="kind")
]


class SideRef(_Strict):
    checkpoint: CheckpointRef
    batch_size: int


class VerdictProvenance(_Strict):
    baseline: SideRef
    candidate: SideRef
    golden: GoldenRef
    task_versions: dict[str, float | str]
    lm_eval_version: str
    seed: int
    suite: str
    # sha256 of the score file each side's evidence was read from (a cache entry or a file given on the command
    # line); None for a candidate scored in this run (its evidence read from no file): pin a baseline's with
    # `baseline_scores_sha256:`
    score_files: dict[str, str | None] = Field(default_factory=dict)
    # where the candidate's scores (and agreement) came from: "computed" in this run (in full or in stages),
    # "cache" (a restored cache's entry, only on --trust-cached-candidate), "file" (a score file given); None in a
    # verdict written before the gate said so (docs/reliability.md, "What a restored cache may supply")
    candidate_scores: Literal["computed", "cache", "file"] | None = None


class SequentialRecord(_Strict):
    """How a sequential gate ran: its schedule and boundaries, how far it went, what it scored."""

    looks: list[float]  # planned cumulative fractions
    bounds: list[float]  # one-sided critical value at each look (Lan–DeMets O'Brien–Fleming spending)
    stable_margin: float
    stable_fraction: float
    task_stable_fraction: dict[str, float] = Field(default_factory=dict)  # per-task overrides of stable_fraction
    looks_taken: int  # 0: stopped by an agreement regression before the first look
    # agreement looks taken before the first (same schedule and bounds); None: agreement measured once, every item
    agreement_looks_taken: int | None = None
    items_scored: dict[str, int]  # candidate items scored per task
    items_total: dict[str, int]  # items in the golden set per task
    strata: dict[str, dict[str, int]]  # per task: items per stratum in the golden set
    candidate_seconds: float | None = None  # wall time spent scoring the candidate (None: from a cache)
    # the batch plan: the candidate's lm-eval runs in order, items per task each (lm-eval sorts one run's requests
    # by length and cuts them into batches of batch_size, so the run's items fix its batches); [] from a cache
    batch_size: int | None = None
    stage_runs: list[dict[str, int]] = Field(default_factory=list)
    agreement_runs: list[int] = Field(default_factory=list)  # staged agreement: agreement items each look scored
    agreement_seconds: float | None = None  # wall time of the staged agreement (the candidate's load included)


class Verdict(Record):
    WHAT: ClassVar[str] = "gate verdict"
    EVIDENCE: ClassVar[bool] = True
    REGENERATE: ClassVar[str] = "run `quantize gate POLICY --baseline B --candidate C --json` again"

    schema_version: Literal[2] = 2  # 2: checkpoint identities in the provenance
    policy: str
    verdict: GateOutcome
    exit_code: int
    rules: list[RuleResult]
    provenance: VerdictProvenance
    notes: list[str] = Field(default_factory=list)
    sequential: SequentialRecord | None = None  # None: the fixed design (every item scored)

    def accuracy_evidence(self, task: str) -> AccuracyEvidence | None:
        """The evidence of the first accuracy rule on `task`, whatever the rule is named."""
        return next((r.evidence for r in self.rules if isinstance(r, AccuracyResult) and r.task == task), None)


# --- search ----------------------------------------------------------------------------------------


class UnitRecord(_Strict):
    name: str
    parameters: int
    bytes: dict[str, int]  # option -> true bytes of the unit's weights
    kl: dict[str, float]  # option -> mean KL with the unit alone quantized so


class AllocationRecord(_Strict):
    label: str  # "searched", "random 1", "first and last blocks at W8A16", "try 2"
    bytes: int  # predicted true bytes of the whole model
    bits_per_weight: float
    predicted_kl: float  # Σ of the units' KL (additive model)
    holdout_kl: float | None  # measured with every unit quantized so, on held-out agreement items
    holdout_top1: float | None
    options: dict[str, int]  # option -> number of units
    allocation: dict[str, str]  # unit -> option


class TryRecord(_Strict):
    allocation: AllocationRecord
    gated: bool  # False: the held-out agreement already broke the policy's limits, so it was not gated
    checkpoint: str | None
    true_bytes: int | None  # read back from the written checkpoint
    verdict: GateOutcome | None
    failed_rules: list[str]
    note: str = ""  # why it was not gated


class SensitivityRecord(Record):
    """$QUANTIZE_CACHE/search/sens-*.json: each layer group's damage per option, keyed by what changes it."""

    WHAT: ClassVar[str] = "sensitivity cache entry"
    REGENERATE: ClassVar[str] = "delete it; the next `quantize search` measures again"

    schema_version: Literal[1] = 1
    key: str
    kl: dict[str, dict[str, float]]  # layer group -> option -> mean KL with it alone quantized so
    seconds: float


class SearchReport(Record):
    """search.json: what `quantize search` measured, compared and tried."""

    WHAT: ClassVar[str] = "search report"
    REGENERATE: ClassVar[str] = "run `quantize search SPEC` again (sensitivities are cached)"

    schema_version: Literal[1] = 1
    created: str
    spec: str
    spec_sha256: str
    resolved: dict[str, Any]
    model: str
    policy: str
    budgets_bits: list[float]
    source_parameters: int
    fixed_bytes: int
    smallest_bits_per_weight: float
    sensitivity_key: str
    sensitivity_seconds: float
    items: dict[str, int]  # "sensitivity" / "holdout" -> agreement items
    units: list[UnitRecord]
    comparisons: list[AllocationRecord]
    tries: list[TryRecord]
    result: str | None  # the checkpoint that passed, or None
    drivers: list[str]  # when none passed: the layer groups that damage most at the base option


# --- sweep ------------------------------------------------------------------------------------------

TaskKind = Literal["convert", "baseline", "gate"]


class AttemptRecord(_Strict):
    """One run of a task in a worker process: where, and how it ended."""

    pid: int
    node: str  # the Ray node id
    host: str  # the node's address
    started: str
    threads: int  # torch's thread count in the worker (the task's num_cpus)
    outcome: Literal["finished", "died"]  # died: the worker process ended before the task returned
    seconds: float | None  # wall time in the worker; None when it died
    log: str  # the attempt's stdout and stderr


class SweepTaskRecord(_Strict):
    task: str  # "baseline", "convert NAME", "gate NAME"
    kind: TaskKind
    candidate: str | None  # None: the baseline
    state: Literal["done", "failed", "skipped", "not run"]  # skipped: its record was complete from an earlier run
    exit_code: int | None  # the command's: 0, 1 (gate rejected), 2 bad input, 3 failure; None: not run
    message: str
    attempts: list[AttemptRecord]
    record: str | None  # what the task wrote: a quantize.json or a gate.json
    scored: list[str]  # identities this task scored in full (not from the cache)


class CandidateRecord(_Strict):
    name: str
    source: str  # the recipe file, or the checkpoint folder given
    checkpoint: str | None  # the folder gated (None: no conversion was made)
    bits_per_weight: float | None
    verdict: GateOutcome | None
    failed_rules: list[str]
    exit_code: int  # 0 pass, 1 rejected or inconclusive, 2 bad input, 3 failure
    message: str
    wall_seconds: float | None  # its tasks' worker time in this run (None: nothing ran)
    nodes: list[str]
    total_bytes: int | None = None  # every tensor's bytes (None: no checkpoint)
    matrix: dict[str, Any] | None = None  # a matrix cell's values by recipe field (None: not a cell)


class PlannedTask(_Strict):
    task: str  # "baseline", "convert NAME", "gate NAME"
    kind: TaskKind
    candidate: str | None
    after: list[str]  # the tasks whose results it takes (Ray starts it when they are done)
    resources: dict[str, Any]  # what it asks the cluster for: num_cpus, num_gpus, memory, custom resources


class PlannedCandidate(_Strict):
    name: str
    source: str
    checkpoint: str | None  # its output folder (None: refused before it had one)
    recipe: str | None  # the recipe file converted (a matrix cell's: written when it runs)
    matrix: dict[str, Any] | None  # a matrix cell's values by recipe field
    todo: Literal["convert and gate", "gate", "done", "refused"]
    message: str  # why refused; the earlier verdict when done


class SweepPlan(Record):
    """`quantize sweep FILE --plan`: what the sweep would run, found without Ray (nothing is written)."""

    WHAT: ClassVar[str] = "sweep plan"

    schema_version: Literal[1] = 1
    spec: str
    spec_sha256: str
    home: str  # OUTPUT/sweep-NAME
    address: str
    policy: str
    baseline: str
    candidates: list[PlannedCandidate]
    tasks: list[PlannedTask]


class SweepRecord(Record):
    """OUTPUT/sweep-NAME/sweep.json: what `quantize sweep` ran, where, and what each candidate came to."""

    WHAT: ClassVar[str] = "sweep record"
    REGENERATE: ClassVar[str] = "run `quantize sweep SWEEP` again (finished candidates are skipped)"

    schema_version: Literal[1] = 1
    created: str
    spec: str
    spec_sha256: str
    resolved: dict[str, Any]
    address: str
    nodes: list[str]  # node id and address of every node alive at the start
    policy: str
    baseline: str
    candidates: list[CandidateRecord]
    tasks: list[SweepTaskRecord]
    wall_seconds: float
    report: str | None  # the report folder (None: it could not be drawn; the reason is in `notes`)
    exit_code: int
    notes: list[str] = Field(default_factory=list)


# --- reading and writing ---------------------------------------------------------------------------


def to_json(record: Record) -> str:
    """The record as JSON. JSON has no NaN or infinity: an evidence record (scores, agreement, a verdict) writes
    them as the strings "NaN", "Infinity", "-Infinity", which read back as floats; in any other record a
    non-finite number is a RuntimeFailure naming the field (our bug, exit 3)."""
    data = record.model_dump()
    if record.EVIDENCE:
        data = _finite_or_named(data)
    try:
        return json.dumps(data, indent=2, default=str, allow_nan=False) + "\n"
    except ValueError:
        raise RuntimeFailure(
            f"{record.WHAT}: {', '.join(non_finite_fields(data)) or 'a value'} is not a finite number, which no record "
            "may hold; report this as a bug with the command that wrote it"
        ) from None


def _finite_or_named(data: Any) -> Any:
    """JSON-ready data with each non-finite float replaced by its JSON string name."""
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, dict):
        return {k: _finite_or_named(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite_or_named(v) for v in data]
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
    from quantize.io import sha256_bytes, write_text_atomic

    text = to_json(record)
    write_text_atomic(Path(path), text)
    return sha256_bytes(text.encode("utf-8"))


def parse(model: type[R], data: Any, origin: str) -> R:
    """Validate parsed JSON as a record; another schema version, or a file from before versions, is refused."""
    from quantize.config import Wording, validate

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
    from quantize.io import read_user_file

    path = Path(path)
    return loads(model, read_user_file(path, model.WHAT, model.MAX_BYTES, hint=model.REGENERATE), path)


def loads(model: type[R], raw: bytes, path: Path) -> R:
    """A record from the bytes of its file (for a reader that also hashes them: one read)."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: bad JSON, or an over-long integer
        raise UsageError(f"{path} is not a {model.WHAT}: not valid JSON ({str(e)[:200]}); {model.REGENERATE}") from None
    return parse(model, data, str(path))
