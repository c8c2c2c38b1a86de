"""This machine, as what it computes on changes a number: the CPU's name and the thread count torch computes with.

A CPU matmul splits its float sums by thread count and by what the CPU's kernels block for, so the same model on
the same input gives last-bit differences between machines and thread counts. A checkpoint that rounds its
activations can carry such a difference across a rounding boundary (docs/results.md, "Torch's thread count moves
activation-quantized scores": up to 1.26 nats a request between 1 and 2 threads), so the score cache keys its
numbers by both (quantize/evaluate/cache.py `Runtime`), and every load for scoring pins torch to `threads()`
(quantize/checkpoint/loader.py `LastModel`) so the count in the key is the count that computed them.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from quantize.errors import UsageError

THREADS_VARIABLE = "OMP_NUM_THREADS"  # torch's own (a sweep's worker sets it to its task's CPUs: cluster/executor)
MAX_THREADS = 4096
TOPOLOGY = Path("/sys/devices/system/cpu")  # Linux's: cpuN/topology/{physical_package_id,core_id}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "unknown CPU"


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
