"""Whether llama.cpp can tokenize text with a GGUF's vocabulary without ending the process: checked in a child
process before this one tokenizes with it.

llama.cpp aborts the whole process (std::terminate) on some vocabularies a header check cannot see: a
SentencePiece-style vocabulary (`tokenizer.ggml.model` llama) without the byte tokens its byte fallback looks up
throws out of `llama_vocab::byte_to_token` (seen on llama.cpp's own converter run on a tokenizer.json that
transformers' GGUF loader wrote). In `quantize eval`, `agree` or `gate`, that was a SIGABRT with a gdb backtrace,
not an exit code. So the vocabulary is first loaded alone in a child (`python -m quantize.checkpoint.llama_vocab
FILE`), which tokenizes PROBE, text whose UTF-8 bytes take every value a string's encoding can hold (0x01-0x7F, every
lead byte 0xC2-0xF4 and every continuation byte 0x80-0xBF), with and without special-token parsing and BOS: any
text a suite or a calibration source holds reaches only byte values the probe reached. The child's death is a
UsageError naming the file and llama.cpp's last words on its stderr (its load included: the child captures
nothing itself); its result is kept per file (path, size, mtime, inode) for the process. The child runs with
GGML_NO_BACKTRACE, so no debugger is started.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

from quantize.errors import RuntimeFailure, UsageError
from quantize.quiet import llama_said

TIMEOUT_SECONDS = 120  # loading a vocabulary of 256k tokens and tokenizing PROBE takes about a second
LAST_LINES = 4


def probe_text() -> str:
    """Every code point below U+0800 (so every 1- and 2-byte encoding: bytes 0x01-0x7F, leads 0xC2-0xDF, every
    continuation byte), one code point for each 3-byte lead 0xE0-0xEF and each 4-byte lead 0xF0-0xF4."""
    three = [chr(max(0x800, 0x1000 * k) + 0x41) for k in range(16)]  # U+D041 for lead 0xED: below the surrogates
    four = [chr(0x10000 + 0x40000 * j + 0x1041) for j in range(4)] + [chr(0x100041)]
    return "".join([chr(c) for c in range(1, 0x800)] + three + four)


PROBE = probe_text()


def check_vocabulary(path: Path) -> None:
    """Refuse (UsageError) a GGUF whose vocabulary llama.cpp cannot tokenize with: the child's verdict, kept per
    file as it is now."""
    st = path.stat()
    _checked(str(path), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.cache
def _checked(path: str, _size: int, _mtime: int, _inode: int) -> None:
    env = os.environ | {"GGML_NO_BACKTRACE": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, path],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_SECONDS,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(
            f"llama.cpp took more than {TIMEOUT_SECONDS} s to load and use the vocabulary of {path} in a child "
            "process; the machine may be overloaded: try again"
        ) from None
    if done.returncode == 0:
        return
    # the vocabulary-only context's warning (n_ctx_seq > n_ctx_train) is no part of why it died
    said = llama_said("\n".join(line for line in done.stderr.splitlines() if "n_ctx" not in line), LAST_LINES)
    how = (
        f"was killed by {signal.Signals(-done.returncode).name}"
        if done.returncode < 0 and -done.returncode in signal.Signals._value2member_map_
        else f"exited {done.returncode}"
    )
    raise UsageError(
        f"{path}: llama.cpp cannot tokenize text with this GGUF's vocabulary (tokenizer.ggml.*): a child process that "
        f"loaded it and tokenized every byte value UTF-8 text can hold {how}; llama.cpp said: {said}. The file's "
        "vocabulary is broken (a converter wrote tokens llama.cpp's tokenizer cannot use); convert the model again, "
        "or check its tokenizer files"
    )


def main(argv: list[str]) -> int:
    """The child: load the vocabulary alone, tokenize PROBE every way the scorer and the calibration do."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=argv[0], vocab_only=True, verbose=False)  # what it says goes to the parent
    text = PROBE.encode("utf-8")
    for special in (True, False):
        for bos in (True, False):
            llm.tokenize(text, add_bos=bos, special=special)
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
