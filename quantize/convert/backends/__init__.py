"""The backends that load, quantize and save a model: one module each behind `ConversionBackend`.
The engine calls the protocol and never names a backend; what each one is (its packages, the library
the model card credits, how its checkpoints load) is data on its class.

    llmcompressor   llm-compressor's `oneshot` with compiled modifiers; compressed-tensors format
    gptqmodel       GPTQModel's own GPTQ and AWQ (AutoAWQ's GEMM layout); GPTQ/AWQ format
"""

from __future__ import annotations

from quantize.convert.backends.base import ConversionBackend
from quantize.convert.recipe import Recipe


def _registry() -> dict[str, type[ConversionBackend]]:
    # imported here: importing the package (the engine does) loads no backend library's module
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
