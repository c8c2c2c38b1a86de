"""The backends that load, quantize and save a model: one module (or package) each behind `ConversionBackend`
(base.py). The engine calls the protocol and never names a backend; what each one is and can do (its packages,
the library the model card credits, how its checkpoints load, the schemes it runs, whether it streams, offloads or
linearizes an MoE's experts, its default calibration dtype, what only it refuses) is data on its class, read
through this registry. Importing it imports no backend library (and no torch): each backend imports its library
inside its methods.

    llmcompressor   llm-compressor's `oneshot` with compiled modifiers; compressed-tensors format (a package:
                    the backend, its modifiers, its AWQ/SmoothQuant mapping check, its CPU runtime)
    gptqmodel       GPTQModel's own GPTQ and AWQ (AutoAWQ's GEMM layout); GPTQ/AWQ format
    llamacpp        llama.cpp's own quantizer (`llama_model_quantize`), GGUF to GGUF: method gguf (file to file)
"""

from __future__ import annotations

from quantize.convert.backends.base import ConversionBackend
from quantize.convert.backends.gptqmodel import GPTQModelBackend
from quantize.convert.backends.llamacpp import LlamaCppBackend
from quantize.convert.backends.llmcompressor import LLMCompressorBackend
from quantize.convert.recipe import FILE_METHODS, Method, Recipe, Scheme
from quantize.errors import UsageError

# a recipe's `backend:` value -> its class (a backend added here is seen by recipe checks, memory, dtypes, the plan)
BACKENDS: dict[str, type[ConversionBackend]] = {
    b.name: b for b in (LLMCompressorBackend, GPTQModelBackend, LlamaCppBackend)
}

# The two backends the model card once named, both retired upstream, and what was measured when each was tried here
# (2026-12-01): each recipe asking for them is exit 2 with this, pointing at the backend that writes their format.
RETIRED = {
    "auto-gptq": (
        "AutoGPTQ is retired upstream (its README points to GPTQModel, its maintained successor). AutoGPTQ 0.7.1 "
        "quantizes only on CUDA (from_pretrained refuses without it) and needs transformers 4.x and numpy < 2, "
        "neither of which can join quantize's environments. GPTQModel writes the same GPTQ format: use backend: "
        "gptqmodel (in .venv-gptq, `make gptq-env`). Checkpoints AutoGPTQ wrote are read, scored and gated as they are"
    ),
    "autoawq": (
        "AutoAWQ is retired upstream (adopted by llm-compressor). AutoAWQ 0.2.9 needs transformers 4.51, and on "
        "this project's CPU it wrote a checkpoint far from its source (docs/recipes.md, backends table). For AWQ use "
        "backend: llmcompressor (compressed-tensors format) or backend: gptqmodel (AutoAWQ's own GEMM format). "
        "Checkpoints AutoAWQ wrote are read, scored and gated as they are"
    ),
}


def backend_named(name: str) -> type[ConversionBackend]:
    """The backend class a recipe or a record names; a retired or unknown name is refused (UsageError)."""
    if name in RETIRED:
        raise UsageError(f"backend {name} is not run by quantize: {RETIRED[name]}")
    if name not in BACKENDS:
        raise UsageError(f"backend {name!r} is not one quantize runs; choose one of: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name]


def backend_for(recipe: Recipe) -> ConversionBackend:
    return backend_named(recipe.backend)()


def converts_files(backend: type[ConversionBackend]) -> bool:
    """Whether the backend converts a file into a file (`file_to_file`: `source`, `convert_file`) rather than a
    loaded model (every backend's class says which)."""
    return backend.file_to_file


def runs(backend: type[ConversionBackend], method: Method, scheme: Scheme | None) -> bool:
    """Whether the backend runs this method with this scheme (None: a recipe that names no scheme of this schema, a
    verbatim one's from its `stages:`, a GGUF one's file type in `type:`). A method whose recipes name a file to convert
    (recipe.FILE_METHODS) is run by file-to-file backends alone, and they run nothing else; then, a backend with no
    `schemes` runs every method and scheme a recipe allows."""
    if (method in FILE_METHODS) != converts_files(backend):
        return False
    if backend.schemes is None:
        return True
    return method in backend.schemes and (scheme is None or scheme in backend.schemes[method])


def check(recipe: Recipe) -> None:
    """Refuse (UsageError, before anything loads) a recipe its backend does not run: a retired or unknown backend,
    a method and scheme it does not run, a KV cache it does not quantize, or what only it refuses (its `check`).
    Each refusal names the backends that run it."""
    backend = backend_named(recipe.backend)
    m, s = recipe.method, recipe.scheme_or_none
    if not runs(backend, m, s):
        offered = "; ".join(
            f"method {k.value}" + (f" with scheme {', '.join(sorted(x.value for x in v))}" if v else "")
            for k, v in (backend.schemes or {}).items()
        ) or ("every method a recipe allows but " + ", ".join(sorted(m.value for m in FILE_METHODS)))
        raise UsageError(
            f"backend {backend.name} does not run method {m.value}{f' with scheme {s.value}' if s else ''}; it runs "
            f"{offered}. {_instead([n for n, b in BACKENDS.items() if runs(b, m, s)], 'this method and scheme')}"
        )
    if getattr(recipe, "kv_cache", None) is not None and not backend.kv_cache:
        others = [n for n, b in BACKENDS.items() if b.kv_cache and runs(b, m, s)]
        raise UsageError(f"backend {backend.name} does not quantize the KV cache. {_instead(others, 'a KV cache')}")
    if why := backend.check(recipe):
        raise UsageError(why)


def _instead(names: list[str], what: str) -> str:
    if not names:
        return f"No backend here runs {what}"
    return f"Use {' or '.join(f'backend: {n}' for n in names)} for {what}"


def calibration_default(recipe: Recipe, source: str) -> tuple[str, str] | None:
    """The recipe's backend's default calibration dtype for its method where it is not the checkpoint's own
    (`source`): ("auto" where it keeps the source's dtype, else the dtype it takes; why); None elsewhere."""
    rule = backend_named(recipe.backend).calibration_dtypes.get(recipe.method)
    if rule is None:
        return None
    return ("auto" if source in rule.keeps else rule.otherwise), rule.why
