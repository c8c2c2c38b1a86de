"""The backends that load, quantize and save a model: one module each behind `ConversionBackend`.
The engine calls the protocol and never names a backend; what each one is (its packages, the library
the model card credits, how its checkpoints load) is data on its class.

    llmcompressor   llm-compressor's `oneshot` with compiled modifiers; compressed-tensors format
    gptqmodel       GPTQModel's own GPTQ and AWQ (AutoAWQ's GEMM layout); GPTQ/AWQ format
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from quantize.convert.calibration import CalibrationSet
from quantize.convert.plan import LayerPlan
from quantize.convert.recipe import Recipe


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
    library: str  # the distribution whose version the model card names
    credit: str  # the library's name as the model card credits it
    card_tags: tuple[str, ...]  # the model card's tags for this backend's output
    formats: ClassVar[dict[str, str]]  # method -> the format it writes ("*": any other method)
    load_note: ClassVar[dict[str, str]]  # method -> how transformers loads what it wrote ("*": any other method)

    def prepare(self, recipe: Recipe, plan: LayerPlan) -> Any:
        """Before a model loads: refuse a plan this backend cannot write; what it will run (llm-compressor's
        modifiers, a verbatim recipe's YAML, or None when the backend configures itself from the recipe)."""
        ...

    def load(self, model_dir: Path, recipe: Recipe, dtype: Any, offload_dir: Path | None = None) -> tuple[Any, Any]:
        """(model or None when the backend loads it at quantize time, tokenizer); with `offload_dir` (only a
        backend the memory plan offloads: memory.offloadable) the weights stay on disk in that folder."""
        ...

    def quantize(self, job: Job) -> tuple[Any, Any]:
        """(the quantized model, what ran: recorded in quantize.json's engine.modifiers)."""
        ...

    def save(self, model: Any, folder: Path) -> None: ...

    def stream(self, model_dir: Path, folder: Path, prepared: Any) -> str:
        """Convert a data-free recipe shard by shard from model_dir into folder, never the whole model in memory
        (only backends memory.streamable accepts: llm-compressor); returns what ran, as `quantize` does."""
        ...

    def release(self) -> None:
        """Let the quantized model's memory go once the caller has dropped it."""
        ...


def _registry() -> dict[str, type[ConversionBackend]]:
    # imported here: each backend module imports this package's protocol only for typing, never at import
    from quantize.convert.backends.gptqmodel import GPTQModelBackend
    from quantize.convert.backends.llmcompressor import LLMCompressorBackend

    return {b.name: b for b in (LLMCompressorBackend, GPTQModelBackend)}


def backend_for(recipe: Recipe) -> ConversionBackend:
    registry = _registry()
    assert recipe.backend.value in registry, f"backend {recipe.backend} passed recipe validation without a module"
    return registry[recipe.backend.value]()


def backend_named(name: str) -> type[ConversionBackend]:
    """The backend class a record names (quantize.json's engine.backend)."""
    return _registry()[name]
