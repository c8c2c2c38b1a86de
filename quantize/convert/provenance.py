"""Provenance: library versions, wall time per phase and peak memory."""

from __future__ import annotations

import platform
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from quantize import progress

LIBRARIES = ("torch", "transformers", "llmcompressor", "compressed-tensors", "lm_eval", "safetensors", "datasets")


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"quantize": _version("quantize"), "python": platform.python_version()}
    return out | {lib: _version(lib) for lib in LIBRARIES}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def peak_rss_bytes() -> int:
    """Peak resident memory of this process. On Linux the address space's high-water mark (VmHWM, KiB), which
    starts anew at exec: getrusage's ru_maxrss survives execve, so a run started by a large process (a benchmark
    that had loaded a model) reported that process's peak as its own. Elsewhere ru_maxrss (macOS: bytes)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def peak_accelerator_bytes() -> int | None:
    """Peak memory torch allocated on the accelerator it runs on (CUDA, XPU, ...); None without one."""
    try:
        import torch
    except ImportError:
        return None
    return int(torch.accelerator.max_memory_allocated()) if torch.accelerator.is_available() else None


class Phases:
    """Wall time per named phase: `with phases("calibrate"): ...`; each phase a stage of the command's progress
    lines (quantize/progress.py)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            with progress.stage(f"run: {name}"):
                yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t0, 3)

    def total(self) -> float:
        return round(sum(self.seconds.values()), 3)


def memory_record() -> dict[str, Any]:
    return {"peak_rss_bytes": peak_rss_bytes(), "peak_accelerator_bytes": peak_accelerator_bytes()}
