"""Quiet libraries for `--quiet` and `--json`: what they print never reaches our stdout. Every stage uses it;
it imports the libraries only when quiet is asked for, and undoes every change on exit."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from quantize import progress

# Loggers the libraries write progress and warnings to (loguru for llm-compressor, logging for the rest).
LOGURU = ("llmcompressor", "compressed_tensors")
LOGGING = ("lm-eval", "lm_eval", "transformers", "datasets", "accelerate")


@contextmanager
def _silenced_output() -> Iterator[None]:
    """stdout and stderr to /dev/null, for Python writes and for child processes and C code (file
    descriptors 1 and 2) alike; restored on the way out."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


@contextmanager
def quiet_libraries(quiet: bool) -> Iterator[None]:
    """While the libraries work: what they print goes to stderr, never into our stdout (which may be
    --json). When `quiet`, nothing from them at all: loggers at errors only, no warnings, no progress
    bars, and their remaining stdout/stderr discarded (the CLI turns tqdm's off before any library is
    imported). quantize's own output is printed after, outside this context. quantize's progress lines
    (quantize/progress.py) go to stderr unless `quiet`."""
    if not quiet:
        with progress.shown(True, sys.stderr), contextlib.redirect_stdout(sys.stderr):
            yield
        return
    from loguru import logger
    from transformers.utils import logging as hf_logging

    for name in LOGURU:
        logger.disable(name)
    levels = {name: logging.getLogger(name).level for name in LOGGING}
    for name in LOGGING:
        logging.getLogger(name).setLevel(logging.ERROR)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        # progress bars that the libraries create with an explicit disable=False ignore TQDM_DISABLE:
        # what the libraries write while quiet goes nowhere (quantize's own messages come after)
        with progress.shown(False), warnings.catch_warnings(), _silenced_output():
            warnings.simplefilter("ignore")
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        for name in LOGURU:
            logger.enable(name)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
