"""Which engine scores a checkpoint, decided before anything heavy is imported: a GGUF (checkpoint/ggufs.find) is
scored in llama.cpp (quantize/evaluate/llamacpp.py, through llama-cpp-python: the `gguf` extra, `make gguf-env`),
every other checkpoint in transformers by the suite's backend. Light: it imports no lm-eval, and llama.cpp only to
read what its build computes with when a GGUF's runtime is named (`llamacpp_kernels`)."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

from quantize.checkpoint import ggufs
from quantize.errors import UsageError
from quantize.evaluate.suite import Backend, LlamaCppSettings, Suite

DISTRIBUTION = "llama_cpp_python"
INSTALL = "`make gguf-env` (llama-cpp-python 0.3.36, built from its source distribution: README, GGUF)"
# the revision of what our llama.cpp model (evaluate/llamacpp.py) computes from the engine's logits: part of
# `llamacpp_engine`, so cached scores move with it
LLAMACPP_REVISION = 1


def llamacpp_version() -> str | None:
    """The installed llama-cpp-python's version, None when it is not installed (read without importing it)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def gguf_to_score(checkpoint: str | Path, suite: Suite | None = None) -> Path | None:
    """The GGUF file llama.cpp scores for `checkpoint`, None for a checkpoint transformers scores. A GGUF needs
    llama-cpp-python installed and a header that reads (a malformed file is refused here, before any load); a
    suite asking for `backend: llamacpp` takes GGUF checkpoints only. Each refusal is a UsageError saying what to
    do."""
    gguf = ggufs.find(checkpoint)
    if gguf is None:
        if suite is not None and suite.backend is Backend.llamacpp:
            raise UsageError(
                f"{checkpoint} is not a GGUF checkpoint, and the suite's `backend: llamacpp` scores GGUF files "
                "only: convert it with a GGUF recipe (recipes/gguf-*.yaml), or score it with `backend: quantize`"
            )
        return None
    ggufs.read_header(gguf)  # a truncated or forged file is refused first, whatever is installed
    if llamacpp_version() is None:
        raise UsageError(
            f"{checkpoint} is a GGUF checkpoint ({gguf.name}), scored in llama.cpp, and llama-cpp-python is not "
            f"installed here: install it with {INSTALL}"
        )
    return gguf


def llamacpp_settings(suite: Suite) -> LlamaCppSettings:
    """The suite's `llamacpp:` section, or its defaults."""
    return suite.llamacpp or LlamaCppSettings()


def llamacpp_engine(suite: Suite) -> str:
    """What computes a GGUF's scores besides the file and the suite's text: our revision, llama-cpp-python's version,
    the threads, the decode chunk (`n_batch`) and the kernels its build computes with (`llamacpp_kernels`). Part of
    the cache key (cache.Runtime.engine) and the provenance."""
    s = llamacpp_settings(suite)
    ours = f"llamacpp-{LLAMACPP_REVISION} llama-cpp-python {llamacpp_version()}"
    return f"{ours} threads {s.n_threads} n_batch {s.n_batch} [{llamacpp_kernels()}]"


@functools.cache
def llamacpp_kernels() -> str:
    """The features llama.cpp's backends compute with, from its own `llama_print_system_info()` (the SIMD sets its
    build compiled in or picked for this CPU, llamafile's matmuls, weight repacking): those on, by backend, e.g.
    "CPU: SSE3 SSSE3 AVX AVX2 F16C FMA BMI2 LLAMAFILE OPENMP REPACK". One version of llama-cpp-python builds with
    other kernels under other CMAKE_ARGS (or on a machine that builds for its own CPU), and its numbers move with
    them (docs/results.md)."""
    import llama_cpp

    return system_features(llama_cpp.llama_print_system_info().decode(errors="replace"))


def system_features(info: str) -> str:
    """llama.cpp's "CPU : SSE3 = 1 | AVX = 0 | ... | " as "CPU: SSE3 ...": each backend's features that are on
    (a value other than 1 kept as NAME=VALUE)."""
    out = []
    for part in info.split("|"):
        if ":" in part:  # "CPU : SSE3 = 1": a backend's first feature
            backend, _, part = part.partition(":")
            out.append(f"{backend.strip()}:")
        name, eq, value = (x.strip() for x in part.partition("="))
        if name and eq and value not in ("", "0"):
            out.append(name if value == "1" else f"{name}={value}")
    return " ".join(out)
