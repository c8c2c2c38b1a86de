"""This machine, as what it computes on changes a number: the CPU as its kernels see it (its name, its SIMD
extensions, the variables that cap them) and the thread count torch computes with.

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
import os
import platform
from pathlib import Path

from quantize.errors import UsageError

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
