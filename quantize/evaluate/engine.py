"""Which engine scores a checkpoint, decided before anything heavy is imported: a GGUF (checkpoint/ggufs.find) is
scored in llama.cpp (quantize/evaluate/llamacpp.py, through llama-cpp-python: the `gguf` extra, `make gguf-env`),
every other checkpoint in transformers by the suite's backend. Light: it imports neither llama.cpp nor lm-eval."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from quantize.checkpoint import ggufs
from quantize.errors import UsageError
from quantize.evaluate.suite import Backend, LlamaCppSettings, Suite
from quantize.machine import llamacpp_build, llamacpp_variables

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
    llama-cpp-python installed and a header that reads, of a model (a malformed file, an adapter, a projector or an
    importance matrix is refused here, before any load: ggufs.check_model); a suite asking for `backend: llamacpp`
    takes GGUF checkpoints only. Each refusal is a UsageError saying what to do."""
    gguf = ggufs.find(checkpoint)
    if gguf is None:
        if suite is not None and suite.backend is Backend.llamacpp:
            raise UsageError(
                f"{checkpoint} is not a GGUF checkpoint, and the suite's `backend: llamacpp` scores GGUF files "
                "only: convert it with a GGUF recipe (recipes/gguf-*.yaml), or score it with `backend: quantize`"
            )
        return None
    ggufs.check_model(ggufs.read_header(gguf))  # a truncated, forged or non-model file is refused first
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
    the threads, the decode chunk (`n_batch`), the build (`llamacpp_build`) and any of llama.cpp's runtime switches
    set here (`llamacpp_variables`, after "env"). Part of the cache key (cache.Runtime.engine) and the provenance."""
    s = llamacpp_settings(suite)
    ours = f"llamacpp-{LLAMACPP_REVISION} llama-cpp-python {llamacpp_version()}"
    switches = f" env {v}" if (v := llamacpp_variables()) else ""
    return f"{ours} threads {s.n_threads} n_batch {s.n_batch} build {llamacpp_build()}{switches}"
