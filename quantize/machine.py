"""This machine, as what it computes on changes a number: the CPU as its kernels see it (its name, its SIMD
extensions, the variables that cap them), the thread count torch computes with, and the native libraries llama.cpp
computes with (`llamacpp_build`: the build that keys a GGUF's scores and is recorded with a GGUF conversion).

A CPU matmul splits its float sums by thread count and by what the CPU's kernels block for, so the same model on
the same input gives last-bit differences between machines and thread counts. A checkpoint that rounds its
activations can carry such a difference across a rounding boundary (docs/results.md, "Torch's thread count moves
activation-quantized scores": up to 1.26 nats a request between 1 and 2 threads; up to 1.62 between torch's AVX2
kernels and its default ones on one CPU, benchmarks/isa_variance.py), so the score cache keys its numbers by both
(quantize/evaluate/cache.py `Runtime`), and every load for scoring pins torch to `threads()`
(quantize/checkpoint/loader.py `LastModel`) so the count in the key is the count that computed them.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from quantize.errors import RuntimeFailure, UsageError
from quantize.io import sha256_file, sha256_named

THREADS_VARIABLE = "OMP_NUM_THREADS"  # torch's own (a sweep's worker sets it to its task's CPUs: cluster/executor)
MAX_THREADS = 4096
TOPOLOGY = Path("/sys/devices/system/cpu")  # Linux's: cpuN/topology/{physical_package_id,core_id}
CPUINFO = Path("/proc/cpuinfo")
# The SIMD extensions among the CPU's flags, by prefix of the line that lists them (x86 "flags", Arm "Features"):
# what torch's own kernels (its CPU capability: DEFAULT, AVX2, AVX512, ...) and its BLAS pick their code by. A VM
# masks its CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) Processor") over generations whose extensions differ.
SIMD_PREFIXES = {"flags": ("avx", "amx", "fma", "f16c"), "Features": ("asimd", "sve", "sme", "i8mm", "bf16", "fphp")}
# Variables that cap or change those picks, read by the libraries torch computes with when they load
KERNEL_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "MKL_DEBUG_CPU_TYPE",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "DNNL_DEFAULT_FPMATH_MODE",
    "OMP_THREAD_LIMIT",  # caps OpenMP's threads below the count torch reports (and the key's thread count says)
)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's machine name."""
    return _cpuinfo(CPUINFO)[0] or platform.machine() or "unknown CPU"


def cpu_kernels() -> str:
    """This CPU as its math kernels see it: its name, then its SIMD extensions (SIMD_PREFIXES) and any
    KERNEL_VARIABLES set, e.g. "AMD EPYC (avx avx2 f16c fma)" or "AMD EPYC (avx avx2 f16c fma;
    ATEN_CPU_CAPABILITY=default)"; the name alone where the OS lists no flags."""
    simd = _cpuinfo(CPUINFO)[1]
    caps = [f"{v}={os.environ[v]}" for v in KERNEL_VARIABLES if os.environ.get(v, "").strip()]
    inside = "; ".join(x for x in (" ".join(simd), " ".join(caps)) if x)
    return f"{cpu_name()} ({inside})" if inside else cpu_name()


@functools.cache
def _cpuinfo(path: Path) -> tuple[str, tuple[str, ...]]:
    """The first CPU's model name and its sorted SIMD extensions (SIMD_PREFIXES) from a /proc/cpuinfo-style file
    ("", () where unreadable)."""
    name, flags = "", ()
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return name, flags
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key in SIMD_PREFIXES and not flags:
            flags = tuple(sorted({f for f in value.split() if f.startswith(SIMD_PREFIXES[key])}))
        if name and flags:
            break
    return name, flags


def threads() -> int:
    """The thread count torch computes with while quantize scores on a CPU: OMP_NUM_THREADS where set (torch's
    own variable: its first number, as torch reads a nested list "4,2"), else the physical cores among the CPUs
    this process may run on (`physical_cores`: torch's own default counts the whole machine's physical cores,
    whatever the process's affinity)."""
    raw = os.environ.get(THREADS_VARIABLE, "").strip()
    if not raw:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        return physical_cores(cpus)
    first = raw.split(",", 1)[0].strip()
    if not first.isdecimal() or not 1 <= int(first) <= MAX_THREADS:
        raise UsageError(
            f"{THREADS_VARIABLE} is {raw[:40]!r}: it sets how many threads torch computes with; set it to a whole "
            f"number from 1 to {MAX_THREADS}, or unset it to use the physical cores this process may run on"
        )
    return int(first)


def physical_cores(cpus: set[int]) -> int:
    """How many physical cores the logical CPUs `cpus` sit on: their distinct (package, core) pairs in Linux's
    CPU topology (TOPOLOGY), two hyperthreads of one core counted once; len(cpus) where that is not readable."""
    cores = set()
    for cpu in cpus:
        where = TOPOLOGY / f"cpu{cpu}" / "topology"
        try:
            cores.add(((where / "physical_package_id").read_text().strip(), (where / "core_id").read_text().strip()))
        except OSError:
            return max(len(cpus), 1)
    return max(len(cores), 1)


LLAMACPP_PACKAGE = "llama_cpp"  # llama-cpp-python's import name
# Which native libraries an import of llama-cpp-python maps: libllama from the folder LIB_PATH_VARIABLE names where
# it is set (llama-cpp-python's documented override), else from its package's `lib`; its ggml libraries through the
# dynamic loader, which takes LD_PRELOAD's and LD_LIBRARY_PATH's before the folder's own (their RUNPATH, $ORIGIN)
LIB_PATH_VARIABLE = "LLAMA_CPP_LIB_PATH"
LOADER_VARIABLES = ("LD_PRELOAD", "LD_LIBRARY_PATH")
NATIVE = ("libllama", "libggml")  # llama.cpp's libraries by name: libllama, libggml, libggml-base, libggml-cpu, ...
MAPS = Path("/proc/self/maps")  # Linux: the files this process maps
# llama.cpp's runtime switches, read by its libraries as they compute: ggml's by its prefix (GGML_CPU_TILED_MM,
# GGML_CPU_DISABLE_FUSION, GGML_BACKEND_PATH, ...: a switch a later version adds is caught too), libllama's by name
# (LLAMA_ is other programs' prefix too, LlamaIndex's API keys among them, which must not reach a key or a record)
GGML_PREFIX = "GGML_"
LLAMA_SWITCHES = ("LLAMA_ATTN_ROT_DISABLE",)


def llamacpp_build() -> str:
    """The build of llama.cpp an import of llama-cpp-python here would compute with: `libraries_identity` of
    `llamacpp_libraries`, found without importing it. One version compiles other kernels under other CMAKE_ARGS, or
    for the building machine's CPU (GGML_NATIVE, upstream's default), pip reuses a wheel it built before whatever
    the CMAKE_ARGS are now, and llama.cpp's numbers move with the kernels (docs/results.md): the version alone does
    not say what computed. "none" where llama-cpp-python is not installed."""
    return libraries_identity(llamacpp_libraries())


def llamacpp_variables() -> str:
    """llama.cpp's runtime switches set here (a GGML_ variable, or one of LLAMA_SWITCHES), as "NAME=value", by name
    and space-separated; "" for none."""
    names = sorted(v for v in os.environ if v.startswith(GGML_PREFIX) or v in LLAMA_SWITCHES)
    return " ".join(f"{v}={os.environ[v]}" for v in names)


def llamacpp_libraries() -> tuple[tuple[str, Path], ...]:
    """(label, file) of each native library an import of llama-cpp-python may map, without importing it: every file
    of the folder it loads libllama from (LLAMA_CPP_LIB_PATH where set, else its package's `lib`), labelled by its
    name; then each libllama/libggml file an LD_PRELOAD entry names or an LD_LIBRARY_PATH folder holds (the loader
    takes those first), labelled by the variable and its name. Empty where llama-cpp-python is not installed."""
    spec = importlib.util.find_spec(LLAMACPP_PACKAGE)
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
    keyed by (and the GGUF conversions recorded with) `llamacpp_build` are that build's. Else RuntimeFailure naming
    the library (exit 3, before anything it computed is cached or put in place). Nothing is checked where `maps`
    cannot be read (not Linux)."""
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


def python_child(module: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a child Python running `module` of this process's own quantize package: `-P`
    (neither the working folder nor a script's is put on sys.path, so a `quantize/` folder where the command runs is
    never imported in ours' place: a review ran the vocabulary probe from such a folder, and the probe was skipped),
    with the folder this package was imported from first on PYTHONPATH."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return [sys.executable, "-P", "-m", module], os.environ | {"PYTHONPATH": path}
