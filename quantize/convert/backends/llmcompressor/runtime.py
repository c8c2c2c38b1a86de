"""What llm-compressor needs around a conversion on a torch without an accelerator. No file on disk is
changed; every change is undone on exit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from quantize.checkpoint.loader import device
from quantize.compat.llmcompressor import unpinned


@contextmanager
def cpu_safe_calibration() -> Iterator[None]:
    """llm-compressor pins cached activations for faster host-to-device copies (AWQ's grid search).
    On a torch without an accelerator, Tensor.pin_memory() raises; there is no device to copy to,
    so pinning is skipped for the duration of the run (compat/llmcompressor.py `unpinned`, guarded)."""
    if device() != "cpu":
        yield
        return

    with unpinned():
        yield
