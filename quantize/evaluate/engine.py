"""Which engine scores a checkpoint, decided before anything heavy is imported: a GGUF (checkpoint/ggufs.find) is
scored in llama.cpp (quantize/evaluate/llamacpp.py, through llama-cpp-python: the `gguf` extra, `make gguf-env`),
every other checkpoint in transformers by the suite's backend. Light: it imports neither llama.cpp nor lm-eval."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from quantize.checkpoint import ggufs
from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate.suite import Backend, LlamaCppSettings, Suite
from quantize.io import sha256_file, sha256_named

DISTRIBUTION = "llama_cpp_python"
PACKAGE = "llama_cpp"
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
    the threads, the decode chunk (`n_batch`) and the build (`llamacpp_build`). Part of the cache key
    (cache.Runtime.engine) and the provenance."""
    s = llamacpp_settings(suite)
    ours = f"llamacpp-{LLAMACPP_REVISION} llama-cpp-python {llamacpp_version()}"
    return f"{ours} threads {s.n_threads} n_batch {s.n_batch} build {llamacpp_build()}"


# Which native libraries an import of llama-cpp-python maps: libllama from the folder LIB_PATH_VARIABLE names where
# it is set (llama-cpp-python's documented override), else from its package's `lib`; its ggml libraries through the
# dynamic loader, which takes LD_PRELOAD's and LD_LIBRARY_PATH's before the folder's own (their RUNPATH, $ORIGIN)
LIB_PATH_VARIABLE = "LLAMA_CPP_LIB_PATH"
LOADER_VARIABLES = ("LD_PRELOAD", "LD_LIBRARY_PATH")
NATIVE = ("libllama", "libggml")  # llama.cpp's libraries by name: libllama, libggml, libggml-base, libggml-cpu, ...
MAPS = Path("/proc/self/maps")  # Linux: the files this process maps


def llamacpp_build() -> str:
    """The build of llama.cpp an import of llama-cpp-python here would compute with: `libraries_identity` of
    `llamacpp_libraries`, found without importing it. One version compiles other kernels under other CMAKE_ARGS, or
    for the building machine's CPU (GGML_NATIVE, upstream's default), pip reuses a wheel it built before whatever
    the CMAKE_ARGS are now, and llama.cpp's numbers move with the kernels (docs/results.md): the version alone does
    not say what computed. "none" where llama-cpp-python is not installed."""
    return libraries_identity(llamacpp_libraries())


def llamacpp_libraries() -> tuple[tuple[str, Path], ...]:
    """(label, file) of each native library an import of llama-cpp-python may map, without importing it: every file
    of the folder it loads libllama from (LLAMA_CPP_LIB_PATH where set, else its package's `lib`), labelled by its
    name; then each libllama/libggml file an LD_PRELOAD entry names or an LD_LIBRARY_PATH folder holds (the loader
    takes those first), labelled by the variable and its name. Empty where llama-cpp-python is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        return ()
    folder = Path(os.environ.get(LIB_PATH_VARIABLE) or Path(spec.origin).parent / "lib")
    found = [(p.name, p) for p in _files(folder)]
    for variable in LOADER_VARIABLES:
        for entry in filter(None, re.split(r"[:;\s]+", os.environ.get(variable, ""))):
            held = _files(Path(entry)) if Path(entry).is_dir() else [Path(entry)] if Path(entry).is_file() else []
            found += [(f"{variable} {p.name}", p) for p in held if p.name.startswith(NATIVE)]
    return tuple(found)


def build_identity(folder: Path) -> str:
    """`libraries_identity` of every file in `folder`, each labelled by its name (a link read as the file it
    names): a build's native libraries as compiled. "none" for a folder without files."""
    return libraries_identity(tuple((p.name, p) for p in _files(folder)))


def libraries_identity(libraries: Sequence[tuple[str, Path]]) -> str:
    """The first 16 hex digits of the sha256 of one "LABEL SHA256" line per (label, file), sorted by label; "none"
    for no file. Memoized by each file's path, size, modification time and inode (hashing llama.cpp's libraries
    takes about 50 ms)."""
    if not libraries:
        return "none"
    stamped = []
    for label, p in sorted(libraries, key=lambda lp: lp[0]):
        st = p.stat()
        stamped.append((label, str(p), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev))
    return _digest(tuple(stamped))


@functools.cache
def _digest(stamped: tuple[tuple[str, str, int, int, int, int], ...]) -> str:
    return sha256_named((label, sha256_file(Path(path))) for label, path, *_ in stamped)[:16]


def _files(folder: Path) -> list[Path]:
    """The files of `folder` (links followed), sorted by name; none where it is not a folder."""
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def check_loaded_build(maps: Path = MAPS) -> None:
    """After llama-cpp-python is imported: every libllama/libggml file this process maps is one of the files its
    build is named by (llamacpp_libraries, compared by resolved path) and still the file on disk, so the scores
    keyed by `llamacpp_build` are the ones that build computes. Else RuntimeFailure naming the library (exit 3:
    nothing it would score is cached). Nothing is checked where `maps` cannot be read (not Linux)."""
    try:
        lines = maps.read_text(errors="replace").splitlines()
    except OSError:
        return
    named = {p.resolve() for _, p in llamacpp_libraries()}
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not Path(parts[5]).name.startswith(NATIVE):
            continue
        path = parts[5]
        if path.endswith(" (deleted)") or Path(path).resolve() not in named:
            folder = os.environ.get(LIB_PATH_VARIABLE) or "llama-cpp-python's own lib folder"
            raise RuntimeFailure(
                f"llama.cpp computes here with {path}, which is not among the libraries its build is named by "
                f"({folder}, and llama.cpp's libraries in {' and '.join(LOADER_VARIABLES)}) or no longer the file on "
                "disk: its scores would be cached and judged under another build. Run where the dynamic loader finds "
                f"llama.cpp's libraries in one of those places (set {LIB_PATH_VARIABLE} to their folder), and start "
                "a new process after reinstalling llama-cpp-python"
            )
