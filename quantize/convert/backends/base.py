"""The protocol every conversion backend implements, what it can do (class attributes, read through the registry
before torch loads), and the job it is handed (the package's `BACKENDS` lists the backends; the engine calls this
protocol and never names one)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol

from quantize.convert.calibration import CalibrationSet
from quantize.convert.plan import LayerPlan
from quantize.convert.recipe import Method, Recipe, Scheme
from quantize.records import ExpertRouting


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

    def stream(self, model_dir: Path, folder: Path, prepared: Any) -> str:
        """Convert a data-free recipe shard by shard from model_dir into folder, never the whole model in memory
        (only a recipe in `streams`, where memory.plan chooses it); returns what ran, as `quantize` does."""
        ...

    def release(self) -> None:
        """Let the quantized model's memory go once the caller has dropped it."""
        ...

    def routing(self) -> list[ExpertRouting]:
        """Per MoE layer, the calibration tokens routed to each expert in the last `quantize` (empty when the
        backend does not count them, the model is dense or the recipe data-free)."""
        ...
