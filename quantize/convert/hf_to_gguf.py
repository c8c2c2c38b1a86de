"""A safetensors checkpoint written as a 16-bit GGUF by llama.cpp's own converter (`convert_hf_to_gguf.py`, as
llama-cpp-python 0.3.36 vendors it; `make gguf-env` unpacks it, compat/llama_cpp.converter_home): the first step of
a `method: gguf` recipe whose `model:` is a Hugging Face checkpoint. What it knows of families, tensor names and
tokenizers is the converter's, never restated here.

- Which families: those the converter registers. One it cannot write is refused in its own words, exit 2, before
  a weight is read: `vocabulary` runs it first with --vocab-only, which reads config.json and the tokenizer files.
- The tokenizer: the converter writes the vocabulary (tokens, merges, the pre-tokenizer llama.cpp recognizes by
  the hash of a fixed text's tokenization; an unrecognized one is its refusal). The written vocabulary is then tried
  in llama.cpp in a child process (checkpoint/llama_vocab.check_vocabulary), since some (a SentencePiece-style
  vocabulary without byte tokens) abort llama.cpp's tokenizer: refused, exit 2, before a weight is read.
- What it reads: a folder of links (`stage`) to exactly the files the checkpoint's identity covers (its
  IDENTITY_FILES, the weight files a load reads as files.safetensors_files resolves them), so the converter sees no
  file the identity does not name (its own rule, every model*.safetensors of the folder, would read a stray file
  beside model.safetensors); after the conversion the identity is checked again (files.check_identity).
- No code of the checkpoint runs: safetensors only (files.check_model_dir), and the child (`python -m
  quantize.convert.hf_to_gguf`, `child`) holds every transformers Auto*.from_pretrained to trust_remote_code=False.
- The converter's log (a line per tensor, its progress bar) goes to a file; its last words go into the message
  when it refuses (UsageError) or fails (RuntimeFailure).

`--outtype auto` is the converter's own choice of 16-bit type (BF16 unless the first tensor is float16): the GGUF
llama.cpp's documentation has a user make before llama-quantize.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantize.checkpoint.files import (
    check_identity,
    identity_sha256,
    identity_view,
)
from quantize.checkpoint.llama_vocab import check_vocabulary
from quantize.compat import llama_cpp as compat
from quantize.convert.provenance import peak_rss_bytes
from quantize.errors import RuntimeFailure, UsageError
from quantize.machine import python_child
from quantize.quiet import llama_said

OUTTYPE = "auto"  # the converter's own choice of 16-bit type
VOCAB_TIMEOUT_SECONDS = 600  # config and tokenizer only: seconds on a 256k-token vocabulary
LAST_LINES = 6
INSTALL = "run `make gguf-env` (it unpacks llama.cpp's converter from llama-cpp-python's source distribution)"


REFUSED = "quantize: the converter refused: "  # the child's last line when llama.cpp's converter refused the model
PEAK = "quantize: converter peak resident bytes: "  # the child's line of its own memory high-water mark


def describe() -> str:
    """The converter, as provenance names it."""
    made = compat.converter_version() or "not unpacked"
    return f"llama.cpp's {compat.CONVERTER} (llama-cpp-python {made}, --outtype {OUTTYPE})"


def check_converter(checkpoint: Path) -> None:
    """llama.cpp's converter unpacked here, of the installed llama-cpp-python (UsageError naming what to run)."""
    if found := compat.converter_problems():
        raise UsageError(
            f"model: {checkpoint} is a safetensors checkpoint, which a gguf recipe first writes as a 16-bit GGUF with "
            f"llama.cpp's converter, and here {'; '.join(found)}: {INSTALL}, or set `model:` to a GGUF; nothing "
            "was loaded"
        )


@contextmanager
def vocabulary(checkpoint: Path) -> Iterator[Path]:
    """The checkpoint's vocabulary as the converter writes it (--vocab-only: a GGUF of its header and tokenizer,
    no tensor), in a temporary folder for the length of the block, checked in llama.cpp (check_vocabulary). Refusals
    (UsageError) name the converter's or llama.cpp's words; no weight is read."""
    check_converter(checkpoint)
    with tempfile.TemporaryDirectory(prefix="quantize-gguf-vocab-") as tmp:
        out = Path(tmp) / "vocab.gguf"
        _convert(checkpoint, out, Path(tmp), vocab_only=True)
        try:
            check_vocabulary(out)
        except UsageError as e:
            raise UsageError(
                f"model: {checkpoint}: llama.cpp's converter wrote a vocabulary from its tokenizer files that "
                f"llama.cpp cannot use ({e}). A tokenizer.json written by transformers' GGUF loader (a folder made "
                "from a GGUF) is one such: set `model:` to the GGUF it came from; otherwise fix the checkpoint's "
                "tokenizer files; nothing was loaded"
            ) from None
        yield out


def write(checkpoint: Path, out: Path, scratch: Path) -> int:
    """The checkpoint written as a 16-bit GGUF at `out` by the converter (its log in `scratch`); returns the
    converter process's peak resident bytes (0 where it did not say)."""
    check_converter(checkpoint)
    return _convert(checkpoint, out, scratch, vocab_only=False)


def _convert(checkpoint: Path, out: Path, scratch: Path, *, vocab_only: bool) -> int:
    identity = identity_sha256(checkpoint)
    staged = identity_view(checkpoint, Path(tempfile.mkdtemp(prefix=".staged-", dir=scratch)) / "model")
    log = scratch / ("converter-vocab.log" if vocab_only else "converter.log")
    child, own = python_child(__name__)
    command = [
        *child,
        str(compat.converter_home()),
        str(staged),
        "--outfile",
        str(out),
        "--outtype",
        OUTTYPE,
        *(["--vocab-only"] if vocab_only else []),
    ]
    env = own | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GGML_NO_BACKTRACE": "1"}
    env.pop("NO_LOCAL_GGUF", None)  # the converter's own gguf-py, never PyPI's
    try:
        with log.open("w", encoding="utf-8") as sink:
            done = subprocess.run(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=VOCAB_TIMEOUT_SECONDS if vocab_only else None,
                check=False,
            )
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(
            f"llama.cpp's converter took more than {VOCAB_TIMEOUT_SECONDS} s to write the vocabulary of {checkpoint}; "
            "the machine may be overloaded: try again"
        ) from None
    said = log.read_text(encoding="utf-8", errors="replace")
    what = "its vocabulary" if vocab_only else "it as a 16-bit GGUF"
    if done.returncode == 2:
        raise UsageError(
            f"model: {checkpoint}: {describe()} cannot write {what}: {_refusal(said)}. A "
            "family or tokenizer it does not know needs a llama.cpp that knows it: convert the model with that "
            "one's convert_hf_to_gguf.py and set `model:` to the GGUF; nothing was loaded"
        )
    if done.returncode != 0 or not out.is_file():
        raise RuntimeFailure(
            f"{describe()} failed writing {what} from {checkpoint} (exit "
            f"{done.returncode}); its last words: {llama_said(said, LAST_LINES)}"
        )
    check_identity(checkpoint, identity)
    peaks = [ln.removeprefix(PEAK) for ln in said.splitlines() if ln.startswith(PEAK)]
    return int(peaks[-1]) if peaks and peaks[-1].isdigit() else 0


def _refusal(said: str) -> str:
    """The converter's reason: its REFUSED line, after the last ERROR it logged where it exited on its own."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    reason = next((ln.removeprefix(REFUSED) for ln in reversed(lines) if ln.startswith(REFUSED)), "")
    errors = [ln.split(":", 2)[-1].strip() for ln in lines if ln.startswith("ERROR:")]
    return "; ".join(x for x in (errors[-1] if errors else "", reason) if x) or "no reason given"


def _no_remote_code(cls: Any) -> None:
    """`cls.from_pretrained` held to trust_remote_code=False, whatever its caller asks."""
    load = cls.from_pretrained

    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        kwargs["trust_remote_code"] = False
        return load(*args, **kwargs)

    cls.from_pretrained = staticmethod(from_pretrained)


def child(argv: list[str]) -> int:
    """The child process of `_convert`: llama.cpp's converter run as its command line runs it (`argv` after the
    converter's home: its own arguments), with its own gguf-py first on the path (checked: the PyPI gguf of the
    same number lacks what it writes) and every transformers AutoTokenizer, AutoConfig and AutoProcessor load held
    to trust_remote_code=False (it passes True for several families' tokenizers, and a checkpoint's auto_map would
    then run the checkpoint's own code). Exit 0 when it wrote the file; 2 when it refused the checkpoint (its own
    exit 1 after logging an error, or NotImplementedError, ValueError, FileNotFoundError or KeyError: an
    architecture or tokenizer it does not know, a file or config key the checkpoint lacks), REFUSED and its words
    the last line; 3 with the traceback for anything else. Where it ran to its end, a PEAK line says its resident
    high-water mark (provenance.peak_rss_bytes; the run's memory record takes it in)."""
    home = Path(argv[0])
    sys.path[:0] = [str(home / "gguf-py"), str(home)]
    import gguf

    if not Path(gguf.__file__).resolve().is_relative_to(home.resolve()):
        print(f"gguf was imported from {gguf.__file__}, not from {home / 'gguf-py'}", file=sys.stderr)
        return 3
    import transformers

    for cls in (transformers.AutoTokenizer, transformers.AutoConfig, transformers.AutoProcessor):
        _no_remote_code(cls)
    sys.argv = [str(home / compat.CONVERTER), *argv[1:]]
    try:
        runpy.run_path(str(home / compat.CONVERTER), run_name="__main__")
        print(f"{PEAK}{peak_rss_bytes()}", file=sys.stderr)
    except SystemExit as e:
        print(f"{PEAK}{peak_rss_bytes()}", file=sys.stderr)
        if e.code in (0, None):
            return 0
        print(f"{REFUSED}it exited {e.code}", file=sys.stderr)
        return 2
    except (NotImplementedError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"{REFUSED}{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except Exception:  # any other failure is the converter's own: its traceback, exit 3
        traceback.print_exc()
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
