"""What the libraries need around a run: llm-compressor on a torch without an accelerator, and
quiet progress for `--quiet`. No file on disk is changed; every change is undone on exit."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from quantize.models import device

# Loggers the libraries write progress and warnings to (loguru for llm-compressor, logging for the rest).
LOGURU = ("llmcompressor", "compressed_tensors")
LOGGING = ("lm-eval", "lm_eval", "transformers", "datasets", "accelerate")


@contextmanager
def cpu_safe_calibration() -> Iterator[None]:
    """llm-compressor pins cached activations for faster host-to-device copies (AWQ's grid search).
    On a torch without an accelerator, Tensor.pin_memory() raises; there is no device to copy to,
    so pinning is skipped for the duration of the run."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    if device() != "cpu":
        yield
        return
    original = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original


@contextmanager
def quiet_libraries(quiet: bool) -> Iterator[None]:
    """No progress bars, and only errors from the libraries' loggers, while `quiet`."""
    if not quiet:
        yield
        return
    from loguru import logger

    for name in LOGURU:
        logger.disable(name)
    levels = {name: logging.getLogger(name).level for name in LOGGING}
    for name in LOGGING:
        logging.getLogger(name).setLevel(logging.ERROR)
    old = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        for name in LOGURU:
            logger.enable(name)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = old
