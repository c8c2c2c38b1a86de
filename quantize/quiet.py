"""Quiet libraries for `--quiet` and `--json`: what they print never reaches our stdout. Every stage uses it;
it imports the libraries only when quiet is asked for, and undoes every change on exit. `llama_log` keeps llama.cpp's
own lines off the terminal whatever the flags (the quantizer, the importance matrix, the scorer's loads), and in a
file the caller reads when a call fails."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


LLAMA_CPP_LOGGER = "llama-cpp-python"  # the logging logger whose level llama-cpp-python's log callback obeys
LOG_LINES = 8  # llama.cpp's last log lines said when one of its calls fails


def llama_said(text: str, lines: int = LOG_LINES) -> str:
    """The last `lines` non-empty lines of what llama.cpp wrote (a llama_log file's text, a child's stderr), each
    stripped, joined by " | ": what a message quotes when one of its calls fails."""
    said = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(said[-lines:]) or "(it logged nothing)"


@contextmanager
def llama_log() -> Iterator[Path]:
    """Everything llama.cpp logs while the block runs into a temporary file: file descriptor 2 (C code) and Python's
    sys.stderr (llama-cpp-python's log callback prints there, wherever sys.stderr points), both appending; yields
    the file's path, readable until the context ends. The callback prints only at or above its logger's level,
    which any `Llama(verbose=False)` earlier in the process sets to ERROR (then a quantizer's refusal logged
    nothing, and a file type this model cannot take was exit 3): the level is DEBUG for the block, put back after
    unless a Llama made in the block set its own (its verbose=False then holds for its life, its freeing included)."""
    library = logging.getLogger(LLAMA_CPP_LOGGER)
    level = library.level
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryDirectory(prefix="quantize-llamacpp-") as folder:
        path = Path(folder) / "llama.log"
        with open(path, "ab") as raw, open(path, "a", encoding="utf-8", errors="replace") as text:
            os.dup2(raw.fileno(), 2)
            library.setLevel(logging.DEBUG)
            try:
                with contextlib.redirect_stderr(text):
                    yield path
            finally:
                if library.level == logging.DEBUG:  # else a Llama made in the block set its own: it keeps it
                    library.setLevel(level)
                os.dup2(saved, 2)
                os.close(saved)
