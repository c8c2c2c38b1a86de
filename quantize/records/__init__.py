"""The records the pipeline writes and reads: typed and versioned, each written whole by `write` (never patched
by key) and read back through its model by `read`. One module per file the pipeline writes; this package is
their index and re-exports every name, so importers say `from quantize.records import Verdict`.

    module          record            file                                        written by
    run.py          RunRecord         CHECKPOINT/quantize.json                    `quantize run`
    scores.py       ScoreDoc          $QUANTIZE_CACHE/scores/*.json, eval --json  `quantize eval` (per-item records)
    agreement.py    AgreementResult   $QUANTIZE_CACHE/agreement/cmp-*.json        the agreement scorer
    verdict.py      Verdict           gate --json, CANDIDATE/gate.json            `quantize gate` (VERDICT_FILE: the
                                                                                  name a verdict saved beside its
                                                                                  candidate takes; JUNIT_FILE: its
                                                                                  JUnit XML's)
    sizing.py       SizingReport      golden size --json                          `quantize golden size`
    search.py       SearchReport      OUTPUT/search.json                          `quantize search`, which also reads
                                                                                  the winner's RunRecord and writes it
                                                                                  again with its `search` reference
    sensitivity.py  SensitivityRecord $QUANTIZE_CACHE/search/sensitivity-*.json  `quantize search`
    sweep.py        SweepRecord       OUTPUT/sweep-NAME/sweep.json                `quantize sweep` (every task and
                                                                                  attempt)
                    SweepPlan         sweep --plan --json (nothing is written)    `quantize sweep --plan`
    base.py         Record, the names more than one record uses (outcomes and how a rule's bounds decide one,
                    CheckpointRef, GoldenRef, AgreementMetric),
                    and the one writer and reader: to_json, write, read, loads, parse

Every record carries `schema_version`; `read` refuses a file of another version, or with an unknown or
missing key, as a UsageError (exit 2) that names the file and says how to regenerate it. Records are
plain data (no paths objects, no numpy): `model_dump()` is exactly the JSON that is written. Each record's
module imports base.py and the foundation alone, never another record's module (tests/test_layers.py).
"""

from __future__ import annotations

from quantize.records.agreement import AgreementResult
from quantize.records.base import (
    AgreementMetric,
    CheckpointRef,
    GateOutcome,
    GoldenRef,
    Record,
    RuleOutcome,
    finite_or_named,
    limit_outcome,
    loads,
    non_finite_fields,
    noninferiority_outcome,
    parse,
    read,
    to_json,
    write,
)
from quantize.records.run import (
    BitsRecord,
    CalibrationRecord,
    CalibrationSourceRecord,
    EngineRecord,
    ExpertRouting,
    FiniteCheck,
    GGUFConversion,
    ImatrixRecord,
    LayerPlanRecord,
    LeftAt16,
    MemoryPlanRecord,
    MemoryRecord,
    ModuleBits,
    NotConverted,
    RecipeRef,
    RunRecord,
    SearchRef,
    SourceModel,
    TokenSpread,
    VocabularyOverlap,
)
from quantize.records.scores import (
    ChoiceItem,
    ChoiceTask,
    DocumentItem,
    GenerationItem,
    GenerationTask,
    GreedyItem,
    GreedyTask,
    RollingTask,
    ScoreDoc,
    ScoreProvenance,
    SuiteRef,
    TaskScores,
    non_finite_items,
)
from quantize.records.search import AllocationRecord, SearchReport, TryRecord, UnitRecord
from quantize.records.sensitivity import SensitivityRecord
from quantize.records.sizing import AccuracySizing, PerplexitySizing, SizingReport
from quantize.records.sweep import (
    AttemptRecord,
    CandidateRecord,
    PlannedCandidate,
    PlannedTask,
    SweepPlan,
    SweepRecord,
    SweepTaskRecord,
    TaskKind,
)
from quantize.records.verdict import (
    JUNIT_FILE,
    VERDICT_FILE,
    AccuracyEvidence,
    AccuracyResult,
    AgreementEvidence,
    AgreementRuleResult,
    PerplexityEvidence,
    PerplexityResult,
    RuleResult,
    SequentialRecord,
    SideRef,
    UntestedResult,
    Verdict,
    VerdictProvenance,
    is_verdict_file,
)

__all__ = [
    "JUNIT_FILE",
    "VERDICT_FILE",
    "AccuracyEvidence",
    "AccuracyResult",
    "AccuracySizing",
    "AgreementEvidence",
    "AgreementMetric",
    "AgreementResult",
    "AgreementRuleResult",
    "AllocationRecord",
    "AttemptRecord",
    "BitsRecord",
    "CalibrationRecord",
    "CalibrationSourceRecord",
    "CandidateRecord",
    "CheckpointRef",
    "ChoiceItem",
    "ChoiceTask",
    "DocumentItem",
    "EngineRecord",
    "ExpertRouting",
    "FiniteCheck",
    "GGUFConversion",
    "GateOutcome",
    "GenerationItem",
    "GenerationTask",
    "GoldenRef",
    "GreedyItem",
    "GreedyTask",
    "ImatrixRecord",
    "LayerPlanRecord",
    "LeftAt16",
    "MemoryPlanRecord",
    "MemoryRecord",
    "ModuleBits",
    "NotConverted",
    "PerplexityEvidence",
    "PerplexityResult",
    "PerplexitySizing",
    "PlannedCandidate",
    "PlannedTask",
    "RecipeRef",
    "Record",
    "RollingTask",
    "RuleOutcome",
    "RuleResult",
    "RunRecord",
    "ScoreDoc",
    "ScoreProvenance",
    "SearchRef",
    "SearchReport",
    "SensitivityRecord",
    "SequentialRecord",
    "SideRef",
    "SizingReport",
    "SourceModel",
    "SuiteRef",
    "SweepPlan",
    "SweepRecord",
    "SweepTaskRecord",
    "TaskKind",
    "TaskScores",
    "TokenSpread",
    "TryRecord",
    "UnitRecord",
    "UntestedResult",
    "Verdict",
    "VerdictProvenance",
    "VocabularyOverlap",
    "finite_or_named",
    "is_verdict_file",
    "limit_outcome",
    "loads",
    "non_finite_fields",
    "non_finite_items",
    "noninferiority_outcome",
    "parse",
    "read",
    "to_json",
    "write",
]
