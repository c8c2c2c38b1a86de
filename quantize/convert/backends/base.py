"""The protocol every conversion backend implements, what it can do (class attributes, read through the registry
before torch loads), and the job it is handed (the package's `BACKENDS` lists the backends; the engine calls this
protocol and never names one).

Two kinds of backend: one that converts a loaded model (prepare, load, quantize, save; `stream` for data-free
recipes shard by shard), and one that converts a file into a file in its own library, with no transformers model
anywhere (`file_to_file`: llama.cpp's quantizer, GGUF to GGUF). The second cannot take the first's steps (there is no
model to load, no layer plan on a meta model, no transformers reload), so it has its own narrow seam: `source` (the
file a recipe's `model:` names, checked before anything loads) and `convert_file` (write the output into a folder,
check it in the library that runs it, and say what was written); the engine keeps what is common to both (preflight,
the atomic output folder, the source's identity, the accounting from the written file's header, quantize.json and
the model card)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol

from quantize.convert.calibration import CalibrationSet
from quantize.convert.plan import LayerPlan
from quantize.convert.recipe import Method, Recipe, Scheme
from quantize.records import CalibrationRecord, EngineRecord, ExpertRouting, FiniteCheck, LayerPlanRecord


class CalibrationDtype(NamedTuple):
    """A backend's default calibration dtype for a method, where it is not the checkpoint's own: the source dtypes
    it calibrates in as they are, the dtype it takes for any other, and why (quantize.json records it)."""

    keeps: tuple[str, ...]
    otherwise: str
    why: str


@dataclass(frozen=True)
class Job:
    """What a backend quantizes: the loaded model (None when the backend loads it itself), its tokenizer and
    folder, the recipe, the calibration dtype (None: the checkpoint's own), the calibration tokens (None for
    data-free schemes), what `prepare` returned, and whether the model's weights are offloaded to disk (then
    calibration runs one decoder layer at a time: llm-compressor's sequential pipeline)."""

    model: Any
    tok: Any
    model_dir: Path
    recipe: Recipe
    dtype: Any
    calib: CalibrationSet | None
    prepared: Any
    offloaded: bool = False


@dataclass(frozen=True)
class FileJob:
    """What a file-to-file backend converts: the source file (its `source`), the output folder it writes into (the
    engine's temporary folder, renamed into place when the run succeeds), a scratch folder inside it for
    intermediates (removed by the engine before the output is accounted), the recipe, and the run's phases
    (provenance.Phases: `with job.phases("quantize"): ...`)."""

    source: Path
    folder: Path
    scratch: Path
    recipe: Recipe
    phases: Any


@dataclass(frozen=True)
class FileConversion:
    """What a file-to-file backend wrote and checked: the scheme quantize.json records (its own type name), the
    engine record (what ran, in which library and settings), the layer plan read back from the written file, its
    finiteness checks (each raised RuntimeFailure already when it failed), the library versions it ran, the
    calibration it read (a GGUF's importance matrix), if any, and the peak memory of a child process it ran (llama.cpp's
    converter), which the run's memory record takes in."""

    scheme: str
    engine: EngineRecord
    layer_plan: LayerPlanRecord
    finite: list[FiniteCheck]
    versions: dict[str, str | None]
    calibration: CalibrationRecord | None = None  # the calibration the backend read, where it read one
    child_peak_rss_bytes: int = 0  # the peak resident memory of a process the backend ran the work in, if any


class ConversionBackend(Protocol):
    name: str  # the recipe's `backend:` value
    packages: tuple[str, ...]  # what must be installed beside the core (checked before a model loads)
    install: str  # where those packages are to be had, said when one is missing
    library: str  # the distribution whose version the model card names
    credit: str  # the library's name as the model card credits it
    card_tags: tuple[str, ...]  # the model card's tags for this backend's output
    formats: ClassVar[dict[str, str]]  # method -> the format it writes ("*": any other method)
    load_note: ClassVar[dict[str, str]]  # method -> how transformers loads what it wrote ("*": any other method)
    # What it can do, read through the registry (backends.check, memory, dtypes, the engine's layer plan):
    schemes: ClassVar[dict[Method, frozenset[Scheme]] | None]  # method -> schemes it runs; None: all recipes allow
    kv_cache: ClassVar[bool]  # whether it quantizes the KV cache (a recipe's `kv_cache:`)
    streams: ClassVar[frozenset[tuple[Method, Scheme]]]  # data-free (method, scheme) it converts shard by shard
    offloads: ClassVar[bool]  # whether it calibrates with the weights on disk (`load(offload_dir=)`, Job.offloaded)
    linearizes_experts: ClassVar[bool]  # whether fused MoE experts become per-expert Linear layers it quantizes
    calibration_dtypes: ClassVar[dict[Method, CalibrationDtype]]  # where its default is not the checkpoint's dtype
    # whether it converts a file into a file (`source`, `convert_file`) instead of a loaded model; a backend that does
    # not say converts a loaded model (backends.converts_files)
    file_to_file: ClassVar[bool]
    card_library: str  # a file-to-file backend's: the Hub's library name of what it writes (others': transformers)

    @classmethod
    def check(cls, recipe: Recipe) -> str | None:
        """What only this backend refuses in a recipe the registry's checks (its schemes, the KV cache) let through,
        said as the message of exit 2; None when it runs the recipe. Called before anything loads, torch-free."""
        ...

    def prepare(self, recipe: Recipe, plan: LayerPlan) -> Any:
        """Before a model loads: refuse a plan this backend cannot write; what it will run (llm-compressor's
        modifiers, a verbatim recipe's YAML, or None when the backend configures itself from the recipe)."""
        ...

    def load(self, model_dir: Path, recipe: Recipe, dtype: Any, offload_dir: Path | None = None) -> tuple[Any, Any]:
        """(model or None when the backend loads it at quantize time, tokenizer); with `offload_dir` (only a
        backend that `offloads`, where memory.plan chooses it) the weights stay on disk in that folder."""
        ...

    def quantize(self, job: Job) -> tuple[Any, Any]:
        """(the quantized model, what ran: recorded in quantize.json's engine.modifiers)."""
        ...

    def save(self, model: Any, folder: Path) -> None: ...

    def stream(self, model_dir: Path, folder: Path, prepared: Any, model: Any, held: dict[str, str]) -> str:
        """Convert a data-free recipe shard by shard from model_dir into folder, never the whole model in memory
        (only a recipe in `streams`, where memory.plan chooses it); `model` is the meta-device model the layer plan
        was made on (no weights), which it may alter. Each stored tensor is quantized from its values in the dtype
        `held` names for it (dtypes.held_dtypes: the dtype the in-memory path's load holds it in), so the quantized
        values are that path's. Writes what the in-memory path's save writes but the dtypes of what the quantization
        made and the tensors `held` does not name (the engine casts those after: dtypes.cast_saved_floats). Returns
        what ran, as `quantize` does."""
        ...

    def release(self) -> None:
        """Let the quantized model's memory go once the caller has dropped it."""
        ...

    def routing(self) -> list[ExpertRouting]:
        """Per MoE layer, the calibration tokens routed to each expert in the last `quantize` (empty when the
        backend does not count them, the model is dense or the recipe data-free)."""
        ...

    # a file-to-file backend's two steps (`file_to_file`), in place of prepare, load, quantize, save and stream:

    @classmethod
    def source(cls, recipe: Recipe) -> Path:
        """The file the recipe's `model:` names, checked (UsageError) before anything loads."""
        ...

    def convert_file(self, job: FileJob) -> FileConversion:
        """Write the output into job.folder and check it in the library that wrote it (RuntimeFailure, exit 3, when
        the check fails)."""
        ...
