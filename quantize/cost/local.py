"""This machine as a hardware profile (`--hardware local`): the decode bounds divided by figures measured here, not
read from a datasheet, so a bound can stand beside an engine's measured decode speed on the same machine.

    bandwidth   bytes per second of reading a buffer far larger than the caches (BUFFER_BYTES of float64): numpy's
                sum over it, split into one slice per CPU read in as many threads (numpy's reductions release the
                GIL), the best of REPEATS passes; what a decode step's weight reads run against
    flops       float32 matrix products of N × N through numpy's BLAS, 2 N³ each, the best of REPEATS

Both are this process's own measurements at one moment (another job on the machine lowers them): the profile's
`source` says when, on what CPU and with how many threads. Kept for this boot of the machine (quantize/cache.py
memos, keyed by the CPU and the count of CPUs), so the measurement costs its few seconds once.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from quantize.cache import memo_path, read_memo, write_memo
from quantize.cost.bounds import Hardware
from quantize.machine import cpu_name

NAME = "local"
BUFFER_BYTES = 1 << 30  # 1 GiB: far past any cache of the machines this runs on
N = 1024
REPEATS = 5


def memory_bytes() -> float | None:
    """The machine's memory (MemTotal), None where /proc/meminfo does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_bandwidth(threads: int, nbytes: int = BUFFER_BYTES, repeats: int = REPEATS) -> float:
    """Bytes per second of `threads` threads each summing its slice of an `nbytes` buffer, the best of `repeats`
    (module docstring)."""
    import numpy as np

    buf = np.ones(nbytes // 8, dtype=np.float64)
    parts = np.array_split(buf, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best


def matmul_flops(n: int = N, repeats: int = REPEATS) -> float:
    """FLOP per second of n × n float32 matrix products (2 n³ each), the best of `repeats`."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    a @ b  # the library's first call pays its set-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def profile() -> Hardware:
    """This machine measured (module docstring), or its memo from earlier in this boot."""
    cpus = os.cpu_count() or 1
    cpu = cpu_name()
    path = memo_path("hardware", "local-", {"cpu": cpu, "cpus": cpus, "v": 1})
    if isinstance(found := read_memo(path, "profile"), dict):
        try:
            return Hardware(**found)
        except ValueError:
            pass  # measured again below
    bandwidth, flops = read_bandwidth(cpus, BUFFER_BYTES), matmul_flops(N)
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    hw = Hardware(
        name=NAME,
        hbm_bytes_per_second=bandwidth,
        peak_dense_flops=flops,
        memory_bytes=memory_bytes(),
        source=(
            f"measured on this machine ({cpu}, {cpus} CPUs) at {when}: read bandwidth of a 1 GiB buffer in {cpus} "
            f"threads, float32 {N}x{N} matrix products through numpy's BLAS (quantize/cost/local.py)"
        ),
    )
    write_memo(path, {"profile": hw.model_dump()})
    return hw
