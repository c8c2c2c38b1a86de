"""CHECKPOINT/quantize.json, written by `quantize run`: what was run (the recipe, the layer plan, the engine, the
calibration), on what, with which libraries, in what memory, and the true bits (`BitsRecord`, which
checkpoint/accounting.BitsReport extends); `quantize search` writes it again with its `SearchRef`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from quantize.records.base import Record, Strict


class RecipeRef(Strict):
    path: str
    sha256: str
    resolved: dict[str, Any]
    resolved_sha256: str


class SourceModel(Strict):
    path: str
    weights_sha256: str
    parameters: int | None


class TokenSpread(Strict):
    """Tokens per document over the documents a calibration packed (the last one may be packed in part)."""

    min: int
    median: float
    max: int
    total: int


class CalibrationSourceRecord(Strict):
    """One source of a calibration: what it is, how it was read and what it gave."""

    source: str  # as the recipe gives it
    description: str
    kind: Literal["text", "chat"]  # chat: conversations rendered through the checkpoint's chat template
    field: str | None  # the column (JSONL key) read; None for .txt and the built-in text
    weight: float
    samples: int  # packed rows taken from it
    documents_used: int


class VocabularyOverlap(Strict):
    """How much of a golden set's vocabulary the calibration tokens hold: its items' prompts (doc_to_text) tokenized
    by the checkpoint's tokenizer, each token id looked up among the packed calibration ids."""

    golden: str
    tasks: list[str]
    distinct_tokens: int  # distinct token ids in the golden items
    distinct_share: float  # of those, the share found in the calibration
    token_share: float  # of the golden items' token occurrences, the share whose id is found in the calibration


class CalibrationRecord(Strict):
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


class ExpertRouting(Strict):
    """One MoE layer's calibration: the tokens that passed through it and how many of them its router sent to
    each expert (top-k selections, counted by hooks during calibration); with `all_experts_calibrated` every
    expert's calibration statistics came from all `tokens` (llm-compressor's moe_calibrate_all_experts), the
    routed counts say how often each expert is used."""

    module: str  # the experts module, e.g. model.layers.1.mlp.experts
    tokens: int
    top_k: int
    routed_tokens: list[int]  # per expert, in expert order; sums to tokens × top_k
    all_experts_calibrated: bool


class LeftAt16(Strict):
    """Tensors the saved checkpoint stores at 16 (or 32) bits, for one reason: every such tensor but the exempt ones
    (convert/checks.exempt_at_16 for a safetensors checkpoint, convert/gguf.left_16bit for a GGUF)."""

    why: str
    tensors: list[str]  # as the file stores them
    bytes: int


class NotConverted(Strict):
    """Layers of the source the saved checkpoint does not hold, for one reason: the multi-token-prediction (MTP)
    layers config.json declares after the decoder's (DeepSeek-V3's layers.61), or the MTP module its family stores
    under a prefix of its own (Qwen3-Next's `mtp.*`), which transformers' causal LM does not load, so no conversion
    of a loaded model reaches them."""

    why: str
    layers: list[str]  # each layer's prefix as the source stores it (model.layers.61), or the module's (mtp)
    tensors: int  # tensors of those layers in the source
    bytes: int  # their bytes in the source
    parameters: int  # their parameters in the source (the accounting's); not in bits.source_parameters


class LayerPlanRecord(Strict):
    quantized_layers: int
    by_group_size: dict[str, int]  # "per-channel" or the group size -> number of layers
    adjusted: dict[str, int]  # layers given a smaller group than the recipe's -> their group
    kept_16bit: dict[str, str]  # layer -> why it stayed at 16 bits
    schemes: dict[str, int] = Field(default_factory=dict)  # overrides: scheme -> number of layers given it
    # what the saved checkpoint stores at 16 bits but the exempt tensors (routers and layers the plan keeps, fused
    # experts no conversion reaches, a planned layer the backend did not quantize, parameters no Linear holds), by
    # reason
    left_16bit: list[LeftAt16] = Field(default_factory=list)
    routing: list[ExpertRouting] = Field(default_factory=list)  # per MoE layer, from calibration (none: data-free)
    # source layers the checkpoint does not hold (its MTP layers), by reason; none in records before 2026-12-07
    not_converted: list[NotConverted] = Field(default_factory=list)


class ImatrixRecord(Strict):
    """The importance matrix a GGUF was quantized with (convert/imatrix.py): computed in llama.cpp on which file, over
    how much of the calibration (RunRecord.calibration says which rows), and the sha256 of what the quantizer read."""

    computed_on: str  # the 16-bit GGUF the activations were computed on
    weights: int  # weights with an entry (llama-quantize's "entries")
    products: int  # matrix products read
    rows: int  # calibration rows decoded (llama-imatrix's "chunks")
    tokens: int
    bos_first: bool  # each row's first token replaced by the vocabulary's BOS, as llama-imatrix's chunks
    values_sha256: str  # imatrix.digest: each weight's name and float32 values, in name order


class GGUFConversion(Strict):
    """A GGUF written by llama.cpp's own quantizer (`llama_model_quantize`): from which GGUF, through which 16-bit
    intermediate, to which file type, with how many threads, in which llama.cpp."""

    source_file: str  # the GGUF read (its identity: source_model.weights_sha256)
    source_file_type: str  # its general.file_type, as gguf.LlamaFileType names it (MOSTLY_Q4_1)
    # the 16-bit GGUF the target was quantized from: "F16" when the source held block-quantized tensors and was
    # re-quantized to F16 first (allow_requantize), the converted file's type (MOSTLY_BF16) when the source is a
    # safetensors checkpoint (source_file_type "safetensors"), None when the source was read as it is
    intermediate: str | None
    ftype: str  # llama.cpp's file type written, LLAMA_FTYPE_MOSTLY_<type>
    ftype_id: int  # its value in llama.cpp's enum llama_ftype
    threads: int
    llama_cpp_python: str  # the llama-cpp-python version (its llama.cpp is the one it vendors)
    # its build: the digest of the native libraries that ran (machine.llamacpp_build; None before 2026-12-07)
    llama_cpp_build: str | None = None
    # llama.cpp's runtime switches set while it ran (machine.llamacpp_variables: "NAME=value ..."; "" for none,
    # None before 2026-12-07)
    llama_cpp_switches: str | None = None
    tensor_types: dict[str, int]  # ggml type -> tensors of the written file
    notes: list[str] = Field(default_factory=list)  # what the source's bits mean for the output, and the like
    imatrix: ImatrixRecord | None = None  # the importance matrix it was quantized with (a recipe's calibration)
    tensor_type_overrides: dict[str, str] = Field(default_factory=dict)  # a recipe's tensor_types: pattern -> type
    converter: str | None = None  # what wrote a safetensors source as a GGUF first (convert/hf_to_gguf.describe)


class EngineRecord(Strict):
    backend: str
    # what ran: llm-compressor's recipe YAML (Recipe.create_instance loads it back), or the other backend's
    # description; a list of repr() strings in records written before 2026-12-03
    modifiers: str | list[str]
    calibration_dtype: str
    saved_dtype: str
    calibration_dtype_reason: str = ""  # why that dtype (dtypes.calibration_dtype); empty in older records
    gguf: GGUFConversion | None = None  # a GGUF written by llama.cpp (backend llamacpp); None for every other


class MemoryRecord(Strict):
    peak_rss_bytes: int  # this process's peak, or a child's it ran the work in where higher (llama.cpp's converter)
    peak_accelerator_bytes: int | None


class MemoryPlanRecord(Strict):
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


class FiniteCheck(Strict):
    stage: str
    rows: int
    tokens: int
    finite: bool
    max_abs_logit: float | None  # None for the streamed check, which reads tensors and computes no logits
    tensors_read: int | None = None  # the streamed check: how many stored tensors it read (None: a logits check)


class ModuleBits(Strict):
    module: str
    format: str
    bytes: int
    parameters: int
    roles: dict[str, int]
    bits_per_weight: float | None


class BitsRecord(Strict):
    total_bytes: int
    source_parameters: int | None
    bits_per_weight: float | None  # 8 × total_bytes / source_parameters
    quantized_linear_bits_per_weight: float | None
    quantized_linear_parameters: int
    bytes_by_role: dict[str, int]
    format: str
    modules: list[ModuleBits]
    notes: list[str]


class SearchRef(Strict):
    """In the quantize.json of a checkpoint `quantize search` chose: where the search is recorded."""

    spec: str  # the search recipe's path
    spec_sha256: str
    report: str  # search.json beside quantize.json
    try_index: int
    options: dict[str, int]  # option -> layer groups given it
    holdout_kl: float | None  # None: no held-out items were measured (measure.holdout_per_task: 0)


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
