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
UsageError naming the file, the step it died in and llama.cpp's last words on its stderr (its load included: the
child captures nothing itself); its result is kept per file (device, inode, size, mtime, ctime) for the process.
Before scoring or quantizing, the child then loads the whole model with a small context too (`model=True`): some
headers pass every check of ours and stop llama.cpp on an assertion while it builds the model or reserves the
context's graph (KV heads that do not divide the heads, more experts used than stored), which also ended the
process. Its refusal quotes llama.cpp's reason, then says what is true of it (ADVICE): where llama.cpp's own
converter wrote the file, converting again writes the same file (a limitation of llama.cpp for that model), so the
safetensors checkpoint is scored in transformers instead. The child runs with GGML_NO_BACKTRACE, so no debugger
is started, and imports this process's quantize (never a `quantize/` folder in the working directory).
"""

from __future__ import annotations

import functools
import re
import signal
import subprocess
import sys
from pathlib import Path

from quantize.errors import RuntimeFailure, UsageError
from quantize.machine import python_child
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


# what the child reached, printed before each step: the last one printed is where it stopped
STAGES = {
    "vocabulary": "could not read the file's metadata and vocabulary (an architecture or a key it does not know)",
    "tokenize": (
        "cannot tokenize text with this GGUF's vocabulary (tokenizer.ggml.*): its vocabulary is broken (a converter "
        "wrote tokens llama.cpp's tokenizer cannot use); convert the model again, or check its tokenizer files"
    ),
    "model": (
        "cannot load the model or make a context for it: llama.cpp's loader refuses this file (its tensors' shapes "
        "or its hyperparameters: heads, KV heads, experts, are not what llama.cpp's code for its architecture needs)"
    ),
}
# said after llama.cpp's own reason: when llama.cpp's converter wrote the file, converting again writes the same one
# (seen on tiny OLMoE, GraniteMoeHybrid and Nemotron-H checkpoints through llama-cpp-python 0.3.36's converter: a
# tensor of another shape than the loader asks, a tensor it looks for in a layer the converter wrote without it)
ADVICE = {
    "model": (
        "If llama.cpp's own converter wrote this file, converting again writes the same one: llama.cpp cannot run "
        "this model as its converter writes it (a limitation of llama.cpp for this model), so score the safetensors "
        "checkpoint (its Hugging Face folder, scored in transformers by the default `backend: quantize`) instead; if "
        "another tool wrote it, write it with llama.cpp's converter (a gguf recipe whose `model:` is the folder)"
    ),
}
WHY = re.compile(r"error|assert|fail|terminate|what\(\)|exception", re.IGNORECASE)
PROBE_POSITIONS = 64  # the whole-model probe's context: its graph is reserved as a scoring context's is


def check_vocabulary(path: Path, model: bool = False) -> None:
    """Refuse (UsageError) a GGUF whose vocabulary llama.cpp cannot read or tokenize with, or (`model`: what scoring
    and the quantizer do next) whose model it cannot load with a context (some inconsistent headers stop it on an
    assertion that ends the process: KV heads that do not divide the heads, more experts used than stored): the
    child's verdict, kept per file (its device, inode, size, mtime and ctime) as it is now. A file llama.cpp's
    quantizer wrote in this process (derived) and not touched since takes its source's verdict instead: the
    quantizer copies the source's metadata, vocabulary and tensor shapes and changes only the tensor types (a GGUF
    search writes one file per try, each probed at a whole-model load otherwise)."""
    key = _stat_key(path)
    source = _DERIVED.get(str(path))
    if source is not None and source[0] == key:
        check_vocabulary(source[1], model)
        return
    _checked(str(path), model, key)


_DERIVED: dict[str, tuple[tuple[int, ...], Path]] = {}  # a file our quantizer wrote -> (its stat key, its source)


def derived(path: Path, source: Path) -> None:
    """Record that llama.cpp's quantizer in this process has just written `path` from `source`: check_vocabulary
    holds it to the source's verdict while its stat key (device, inode, size, mtime, ctime) is the one read now."""
    _DERIVED[str(path)] = (_stat_key(path), source)


def _stat_key(path: Path) -> tuple[int, ...]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.cache
def _checked(path: str, model: bool, _stat_key: tuple[int, ...]) -> None:
    command, env = python_child(__name__)  # this process's quantize, never one in the working folder
    try:
        done = subprocess.run(
            [*command, path, "model" if model else "vocabulary"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_SECONDS,
            env=env | {"GGML_NO_BACKTRACE": "1"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(
            f"llama.cpp took more than {TIMEOUT_SECONDS} s to load and use {path} in a child process; the machine "
            "may be overloaded: try again"
        ) from None
    if done.returncode == 0:
        return
    # why it died: llama.cpp's error, assertion or exception lines where it wrote any (the verbose log around them is
    # the model's description), else its last lines; a context's n_ctx warning is never the reason
    lines = [line for line in done.stderr.splitlines() if "n_ctx" not in line]
    said = llama_said("\n".join([line for line in lines if WHY.search(line)] or lines), LAST_LINES)
    how = (
        f"was killed by {signal.Signals(-done.returncode).name}"
        if done.returncode < 0 and -done.returncode in signal.Signals._value2member_map_
        else f"exited {done.returncode}"
    )
    reached = (done.stdout.split() or ["vocabulary"])[-1]
    advice = f". {ADVICE[reached]}" if reached in ADVICE else ""
    raise UsageError(
        f"{path}: llama.cpp {STAGES.get(reached, STAGES['vocabulary'])}. A child process that tried it {how}; "
        f"llama.cpp said: {said}{advice}"
    )


def main(argv: list[str]) -> int:
    """The child: load the vocabulary alone, tokenize PROBE every way the scorer and the calibration do, then (argv[1]
    "model") load the whole model with a small context; each step named on stdout first, llama.cpp's log on stderr
    (the parent quotes its last lines), and a failure exits 1 without a Python traceback."""
    import llama_cpp

    path, model = argv[0], argv[1:] == ["model"]
    try:
        print("vocabulary", flush=True)
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=True)
        print("tokenize", flush=True)
        text = PROBE.encode("utf-8")
        for special in (True, False):
            for bos in (True, False):
                llm.tokenize(text, add_bos=bos, special=special)
        llm.close()
        if model:
            print("model", flush=True)
            n = PROBE_POSITIONS
            llama_cpp.Llama(model_path=path, n_ctx=n, n_batch=n, n_ubatch=n, verbose=True).close()
    except (ValueError, RuntimeError) as e:  # llama-cpp-python's "Failed to load model": llama.cpp logged why
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
