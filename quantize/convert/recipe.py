"""Recipe files: the validated schema that drives a conversion.

A recipe is YAML. It is validated whole, with every error naming the field, the
bad value and what to do, before any model is loaded. The schema is strict
(`extra="forbid"`) and a union per method: a misspelt key, or a setting of another
method (`dampening_frac` in an AWQ recipe), is an error, not a silently ignored option.

    method: gptq            # gptq | awq | smoothquant | fp8 | rtn | llmcompressor | gguf
    scheme: W4A16           # W4A16 | W3A16 | W8A16 | W8A8 | FP8 | FP8_DYNAMIC
                            #   | NVFP4 | NVFP4A16 | MXFP4 | MXFP4A16 | FP8_BLOCK | W4AFP8 (rtn; FORMATS; gptq: *A16)
    kv_cache: {scheme: FP8} # optional: FP8 | FP8_PER_HEAD, static scales (calibrated)
    group_size: 128         # int weights: weights per scale; null = one scale per output channel
    indivisible: smaller-group
    calibration: {source: builtin:jargon, samples: 64, seq_len: 256, seed: 0}
    output: outputs/gptq-w4a16-g128

A GGUF recipe (`method: gguf`, backend llamacpp) names llama.cpp's file type instead, and nothing else applies:

    method: gguf
    type: Q4_K_M            # a name of llama.cpp's LLAMA_FTYPE_MOSTLY_*, checked against the library before a load
    model: path/to/model.gguf   # a GGUF (or a folder of one); empty = the default model's GGUF
"""

from __future__ import annotations

import re
import reprlib
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, field_validator, model_validator

from quantize.compat.compressed_tensors import PRESET_WEIGHT_GROUP
from quantize.config import Wording, load_yaml, validate
from quantize.names import PathPart, PathText, checked
from quantize.patterns import compile_pattern


class Method(str, Enum):
    gptq = "gptq"  # Frantar et al. 2023: second-order weight rounding, layer by layer
    awq = "awq"  # Lin et al. 2024: activation-aware channel scaling, then rounding
    smoothquant = "smoothquant"  # Xiao et al. 2023: migrate activation outliers into W, then W8A8
    fp8 = "fp8"  # Micikevicius et al. 2022: E4M3 weights and activations
    rtn = "rtn"  # round-to-nearest with min-max scales: the no-calibration reference
    llmcompressor = "llmcompressor"  # an llm-compressor recipe given verbatim
    gguf = "gguf"  # llama.cpp's own quantizer: a GGUF of one of its file types (Q8_0, Q4_K_M, IQ4_XS, ...)


class Scheme(str, Enum):
    W4A16 = "W4A16"
    W3A16 = "W3A16"
    W8A16 = "W8A16"
    W8A8 = "W8A8"  # int8 weights (per channel) and int8 activations (dynamic per token)
    FP8 = "FP8"  # E4M3 weights and activations, static per-tensor scales (needs calibration)
    FP8_DYNAMIC = "FP8_DYNAMIC"  # E4M3 weights per channel, activations dynamic per token
    # the formats of 2026, each compressed-tensors' own preset (FORMATS below)
    NVFP4 = "NVFP4"  # FP4 E2M1 weights and activations; an FP8 E4M3 scale per 16, a global FP32 scale (W4A4)
    NVFP4A16 = "NVFP4A16"  # NVFP4 weights, 16-bit activations
    MXFP4 = "MXFP4"  # FP4 E2M1 weights and activations (dynamic), a power-of-two E8M0 scale per 32 (OCP MX)
    MXFP4A16 = "MXFP4A16"  # MXFP4 weights, 16-bit activations
    FP8_BLOCK = "FP8_BLOCK"  # E4M3 weights, one scale per 128×128 block; activations dynamic per 128 (DeepSeek-V3)
    W4AFP8 = "W4AFP8"  # int4 weights, a scale per 128; FP8 E4M3 activations dynamic per token


class Format(NamedTuple):
    """A scheme whose layout the format fixes: its weights per scale along the input axis (a block's side for
    FP8_BLOCK), and whether a layer those cannot divide may take a smaller group (int4's may; FP4's scale
    granularity is the format itself, so such a layer stays at 16 bits or is refused)."""

    group: int
    smaller_group: bool


# the group of each comes from compressed-tensors' preset (compat/compressed_tensors.py, checked against the library
# in tests/compat); whether a smaller group may stand in is this project's rule
FORMATS = {
    s: Format(PRESET_WEIGHT_GROUP[s.value], s is Scheme.W4AFP8)
    for s in (Scheme.NVFP4, Scheme.NVFP4A16, Scheme.MXFP4, Scheme.MXFP4A16, Scheme.FP8_BLOCK, Scheme.W4AFP8)
}


class Indivisible(str, Enum):
    """What to do with a layer whose input features the group size does not divide."""

    smaller_group = "smaller-group"  # the largest group size <= group_size that divides in_features
    keep = "keep"  # leave the layer at 16 bits
    error = "error"  # refuse the recipe for that model


WEIGHT_ONLY_INT = {Scheme.W4A16: 4, Scheme.W3A16: 3, Scheme.W8A16: 8}
METHOD_SCHEMES: dict[Method, set[Scheme]] = {
    # GPTQ rounds the weight-only FP4 forms too (its block update takes their group and global scales)
    Method.gptq: {Scheme.W4A16, Scheme.W3A16, Scheme.W8A16, Scheme.W8A8, Scheme.NVFP4A16, Scheme.MXFP4A16},
    Method.awq: {Scheme.W4A16, Scheme.W3A16, Scheme.W8A16},
    Method.smoothquant: {Scheme.W8A8},
    Method.fp8: {Scheme.FP8, Scheme.FP8_DYNAMIC},
    Method.rtn: {Scheme.W4A16, Scheme.W3A16, Scheme.W8A16, Scheme.W8A8, Scheme.FP8_DYNAMIC, *FORMATS},
}
# NVFP4 (W4A4) keeps a static global scale of its activations: it is calibrated; the others compute theirs per token
DATA_FREE = {(Method.rtn, s) for s in METHOD_SCHEMES[Method.rtn] - {Scheme.NVFP4}} | {(Method.fp8, Scheme.FP8_DYNAMIC)}
MIN_GROUP = 8
# methods whose recipe names a file that a library converts into a file of its own format (no model is loaded here):
# only a backend that converts files (backends.converts_files) runs them, and such a backend runs nothing else
FILE_METHODS = frozenset({Method.gguf})


class Streaming(str, Enum):
    """Whether a data-free recipe converts shard by shard (llm-compressor's model_free_ptq) instead of loading the
    whole model: `auto` streams when the memory plan (convert/memory.py) says the in-memory path does not fit."""

    auto = "auto"
    on = "on"
    off = "off"


class Offload(str, Enum):
    """Whether a calibrated recipe keeps the model's weights on disk and brings one decoder layer at a time into
    memory (llm-compressor's sequential pipeline over compressed-tensors' disk offload) instead of loading the
    whole model: `auto` offloads when the memory plan (convert/memory.py) says the in-memory path does not fit."""

    auto = "auto"
    on = "on"
    off = "off"


SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
SIZE_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
SIZE_UNITS |= {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


MAX_SIZE = 2**64  # bytes: what a 64-bit address space holds; a larger size is a typo, and past a float's range


def parse_size(value: Any) -> int:
    """A memory size: bytes as an integer, or a number with a unit (12GB, 12GiB, 12G = 12 GiB, 500MB), counted
    exactly (Decimal: a float of 400 digits was infinity, and int() of it an OverflowError) and at most MAX_SIZE;
    anything else is a ValueError saying what a size is (the caller names the flag or field)."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = Decimal(value)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value) if isinstance(value, str) else None
        if m is None or m.group(2).lower() not in SIZE_UNITS:
            raise ValueError(f"{value!r} is not a memory size; write bytes, or e.g. 12GB, 12GiB, 500MB")
        n = Decimal(m.group(1)) * SIZE_UNITS[m.group(2).lower()]
    if n > MAX_SIZE:
        raise ValueError(
            f"{reprlib.repr(value)} is more memory than a 64-bit machine addresses (16 EiB); write e.g. 12GB"
        )
    if int(n) <= 0:
        raise ValueError(f"{value!r} is not a memory size above zero")
    return int(n)


class _Fields(BaseModel):
    """Which column of a source holds the text or the conversations; by default a source's `messages` column (chat
    data, rendered through the checkpoint's chat template), else its `text` column."""

    model_config = ConfigDict(extra="forbid")

    text_field: str | None = Field(None, min_length=1, description="the column (JSONL key) of raw text")
    messages_field: str | None = Field(
        None, min_length=1, description="the column (JSONL key) of conversations: lists of {role, content}"
    )
    split: str | None = Field(None, min_length=1, description="the split of a saved DatasetDict; default train")
    task: str | None = Field(None, min_length=1, description="the task of a golden-set version whose items to read")

    @model_validator(mode="after")
    def _one_field(self) -> _Fields:
        if self.text_field is not None and self.messages_field is not None:
            raise ValueError(
                f"text_field {self.text_field!r} and messages_field {self.messages_field!r} are both given; a source "
                "is read as raw text or as conversations: keep one"
            )
        return self


class MixtureSource(_Fields):
    """One source of a calibration mixture and its weight: its share of the packed rows is weight / total."""

    source: str = Field(min_length=1, description="as calibration.source: builtin:jargon, a file or a folder")
    weight: float = Field(description="a positive share, relative to the others")

    @field_validator("weight")
    @classmethod
    def _positive(cls, w: float) -> float:
        if not (0 < w < float("inf")):
            raise ValueError(
                "a weight is a source's share of the packed rows, relative to the others: give a finite "
                "number above 0 (e.g. 0.7 and 0.3)"
            )
        return w


class Calibration(_Fields):
    source: str | None = Field(
        None,
        min_length=1,
        description="builtin:jargon (Jargon File 4.4.7, shipped, the default), a local .txt (blank-line separated), "
        ".jsonl or .parquet file (a text or messages column), a folder saved by datasets' save_to_disk, or a "
        "golden-set version (with task)",
    )
    mixture: list[MixtureSource] | None = Field(
        None, min_length=1, description="several sources, each with a weight, in place of `source`"
    )
    samples: int = Field(64, ge=1, le=100_000, description="number of packed sequences")
    seq_len: int = Field(256, ge=16, le=131_072, description="tokens per sequence")
    seed: int = Field(
        0,
        ge=0,
        le=2**63 - 1,  # torch.manual_seed's range: 2**64 was exit 3 after the load (a review)
        description="seed for the order of the source documents (and of a mixture's rows)",
    )
    overlap_with: str | None = Field(
        None,
        min_length=1,
        description="a golden-set version (e.g. golden/core/v2): record how much of its items' vocabulary the "
        "calibration tokens hold",
    )

    @model_validator(mode="after")
    def _source_or_mixture(self) -> Calibration:
        if self.mixture is None:
            if self.source is None:
                self.source = "builtin:jargon"
            return self
        if self.source is not None:
            raise ValueError(
                f"source {self.source!r} and mixture are both given; list every source under mixture (each with "
                "its weight), or give source alone"
            )
        if self.text_field or self.messages_field or self.split or self.task:
            raise ValueError(
                "text_field, messages_field, split and task belong to each source of a mixture: move them into its "
                "entry"
            )
        return self

    def sources(self) -> list[MixtureSource]:
        """The sources read, each with its own fields: the one source at weight 1, or the mixture's."""
        if self.mixture is not None:
            return list(self.mixture)
        return [
            MixtureSource(
                source=self.source or "builtin:jargon",
                weight=1.0,
                text_field=self.text_field,
                messages_field=self.messages_field,
                split=self.split,
                task=self.task,
            )
        ]


def _allowed(m: Method) -> str:
    return ", ".join(x.value for x in sorted(METHOD_SCHEMES[m], key=lambda x: x.value))


class _Named(BaseModel):
    """Settings every recipe has, whatever converts it."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False)

    name: PathPart | None = Field(
        None, description="a label for reports and the output folder's name (outputs/<name>); defaults to the file name"
    )
    description: str | None = None
    model: str | None = Field(
        None, min_length=1, description="local checkpoint folder; absent (or null) = the embedded default model"
    )  # `model: ""` converted the working folder (a review): the docs said empty meant the default
    backend: str = Field(
        "llmcompressor",
        min_length=1,
        description="the backend that converts (convert/backends: llmcompressor, gptqmodel, llamacpp); what it runs is "
        "checked against its class before anything loads (backends.check)",
    )
    method: Method
    output: PathText | None = Field(None, description="output folder; default outputs/<name>")


def module_patterns(names: list[str], field: str) -> list[str]:
    """Module names and `re:<regex>` patterns (compressed-tensors' form), each regex compiled here (quantize/patterns.py
    compile_pattern, naming `field`): `re:(q_proj` was exit 3 from the layer plan, after the recipe was taken, and
    `re:a{99999999999}` (OverflowError) still was (reviews)."""
    for name in names:
        if name.startswith("re:"):
            compile_pattern(name[3:], field, name)
    return names


class _Recipe(_Named):
    """Settings every method that converts a loaded model has."""

    targets: list[str] = Field(default_factory=lambda: ["Linear"])
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])
    calibration: Calibration | None = Field(default_factory=Calibration)
    dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        None,
        description="dtype to calibrate in; default: the checkpoint's own (float32 for AWQ), the same on every "
        "machine (dtypes.calibration_dtype); quantize.json records the dtype used and why",
    )
    trust_remote_code: bool = Field(
        False, description="run the checkpoint's own Python code at load (only for checkpoints you trust)"
    )
    streaming: Streaming = Field(
        Streaming.auto,
        description="data-free schemes: convert shard by shard (on), never (off), or when the whole model would "
        "not fit (auto); convert/memory.py",
    )
    offload: Offload = Field(
        Offload.auto,
        description="calibrated schemes: keep the weights on disk and calibrate one decoder layer at a time (on), "
        "never (off), or when the whole model would not fit (auto); convert/memory.py",
    )
    max_memory: int | None = Field(
        None, description="memory this run may use (bytes, or e.g. 12GB); default: /proc/meminfo's MemAvailable"
    )

    @field_validator("max_memory", mode="before")
    @classmethod
    def _max_memory(cls, v: Any) -> int | None:
        return None if v is None else parse_size(v)

    @field_validator("targets")
    @classmethod
    def _targets(cls, t: list[str]) -> list[str]:
        if not t:
            raise ValueError("targets is empty, so nothing would be quantized; use [Linear]")
        return module_patterns(t, "targets")

    @field_validator("ignore")
    @classmethod
    def _ignore(cls, t: list[str]) -> list[str]:
        return module_patterns(t, "ignore")

    @property
    def scheme_or_none(self) -> Scheme | None:
        return getattr(self, "scheme", None)

    @property
    def weight_group(self) -> int | None:
        """Weights per scale of a grouped int weight-only scheme; None for per-channel or per-tensor scales."""
        return None

    @property
    def needs_calibration(self) -> bool:
        return (self.method, self.scheme_or_none) not in DATA_FREE

    def _check_scheme(self) -> None:
        m, s = self.method, self.scheme_or_none
        if s is None:
            raise ValueError(f"scheme is required for method {m.value}; choose one of: {_allowed(m)}")
        if s not in METHOD_SCHEMES[m]:
            hint = (
                " (SmoothQuant smooths activations for an 8-bit activation scheme: use W8A8)"
                if m is Method.smoothquant
                else ""
            )
            raise ValueError(f"method {m.value} does not support scheme {s.value}{hint}; choose one of: {_allowed(m)}")
        if self.calibration is None and (m, s) not in DATA_FREE:
            raise ValueError(
                f"method {m.value} with scheme {s.value} needs calibration data; add a `calibration:` section "
                "(for example {source: builtin:jargon, samples: 64, seq_len: 256})"
            )


class KVCacheScheme(str, Enum):
    FP8 = "FP8"  # one static E4M3 scale per K and per V tensor of each layer
    FP8_PER_HEAD = "FP8_PER_HEAD"  # one static E4M3 scale per attention head (compressed-tensors' attn_head)


class KVCache(BaseModel):
    """A quantized KV cache: llm-compressor's `kv_cache_scheme` (static scales, calibrated; the checkpoint's
    config carries it, and a serving engine stores K and V in one byte each)."""

    model_config = ConfigDict(extra="forbid")

    scheme: KVCacheScheme

    @field_validator("scheme", mode="before")
    @classmethod
    def _not_yet(cls, v: Any) -> Any:
        if v == "NVFP4":  # tried: QuantizationArgs(4, float, tensor_group, group_size=16) as kv_cache_scheme
            raise ValueError(
                "an NVFP4 KV cache groups K and V by 16 along head_dim, and compressed-tensors 0.19 refuses group "
                'quantization of attention ("Group quantization cannot be applied to attention"); use FP8 (per '
                "tensor) or FP8_PER_HEAD"
            )
        return v


class _Quantized(_Recipe):
    """Settings of every method that chooses a scheme from this schema."""

    scheme: Scheme | None = None
    symmetric: bool = True
    kv_cache: KVCache | None = Field(None, description="quantize the KV cache too, e.g. {scheme: FP8}")

    @model_validator(mode="after")
    def _combinations(self) -> _Quantized:
        self._check_scheme()
        s = self.scheme
        if not self.symmetric and s is not None and s is not Scheme.W8A8 and s not in WEIGHT_ONLY_INT:
            # compressed-tensors' preset fixes its scales: the flag was recorded and changed nothing (a review)
            raise ValueError(
                f"scheme {s.value} is compressed-tensors' preset with its own (symmetric) scales, so `symmetric: "
                "false` would change nothing; remove it, or pick an int scheme (W4A16, W8A16, W8A8), which takes it"
            )
        if "calibration" in self.model_fields_set and self.calibration is not None and not self.needs_calibration:
            # read, recorded in the run's recipe and provenance, and used by nothing (a review)
            raise ValueError(
                f"method {self.method.value} with scheme {s.value if s else None} is data-free: a `calibration:` "
                "section would be read and recorded, and change nothing it writes; remove it (or write "
                "`calibration: null`), or choose a method that calibrates (gptq, awq, smoothquant) or a kv_cache"
            )
        if self.kv_cache is not None and self.calibration is None:
            raise ValueError(
                f"kv_cache {self.kv_cache.scheme.value} keeps static scales of K and V, measured on calibration "
                "data; add a `calibration:` section (for example {source: builtin:jargon, samples: 64, seq_len: 256})"
            )
        return self

    @property
    def needs_calibration(self) -> bool:
        return (self.method, self.scheme_or_none) not in DATA_FREE or self.kv_cache is not None


class LayerOverride(BaseModel):
    """Another weight-only scheme, or 16 bits, for some layers: mixed precision (what `quantize search` writes)."""

    model_config = ConfigDict(extra="forbid")

    targets: list[str] = Field(min_length=1, description="module names, or 're:<regex>' on module names")
    scheme: Scheme | Literal["keep"]

    @field_validator("targets")
    @classmethod
    def _targets(cls, t: list[str]) -> list[str]:
        return module_patterns(t, "targets")


class GroupedRecipe(_Quantized):
    """Int weight schemes with optional groups along the input axis."""

    group_size: int | None = Field(None, description="weights per scale for int weights; null = per channel")
    indivisible: Indivisible = Indivisible.smaller_group
    overrides: list[LayerOverride] = Field(
        default_factory=list, description="per-layer schemes (first match wins); weight-only int schemes or keep"
    )

    @model_validator(mode="after")
    def _overrides(self) -> GroupedRecipe:
        if not self.overrides:
            return self
        if self.method not in (Method.rtn, Method.gptq):
            raise ValueError(
                f"overrides (mixed precision) are supported for methods rtn and gptq, not {self.method.value}"
            )
        if self.scheme not in WEIGHT_ONLY_INT:
            raise ValueError(
                f"overrides need a weight-only int base scheme (W3A16, W4A16, W8A16), not {self.scheme.value}"
            )
        for o in self.overrides:
            if o.scheme != "keep" and o.scheme not in WEIGHT_ONLY_INT:
                raise ValueError(
                    f"an override's scheme must be W3A16, W4A16, W8A16 or keep, not {o.scheme.value}: one checkpoint "
                    "mixes weight-only int layers only"
                )
        return self

    @field_validator("group_size")
    @classmethod
    def _group_size(cls, g: int | None) -> int | None:
        if g is None:
            return g
        if g < MIN_GROUP or g & (g - 1):
            raise ValueError(
                f"group_size must be a power of two of at least {MIN_GROUP} (kernels such as Marlin and "
                f"exllama take 32, 64 or 128), got {g}; use 128 for 4-bit weights, or null for one scale per channel"
            )
        return g

    @model_validator(mode="after")
    def _groups_only_for_int_weights(self) -> GroupedRecipe:
        if self.scheme in (Scheme.FP8, Scheme.FP8_DYNAMIC, Scheme.W8A8) and self.group_size is not None:
            raise ValueError(
                f"scheme {self.scheme.value} uses one scale per output channel, not groups, so group_size must be "
                f"empty (got {self.group_size}); remove group_size, or use a W4A16 scheme for grouped weights"
            )
        if self.scheme in FORMATS and self.group_size is not None:
            raise ValueError(
                f"scheme {self.scheme.value} fixes its own groups ({FORMATS[self.scheme].group} weights per scale), so "
                f"group_size must be empty (got {self.group_size}); remove it"
            )
        return self

    @property
    def smaller_groups(self) -> bool:
        """Whether a layer the group size cannot divide may take a smaller group (FORMATS fixes it for FP4)."""
        return self.scheme not in FORMATS or FORMATS[self.scheme].smaller_group

    @property
    def weight_group(self) -> int | None:
        if self.scheme in FORMATS:
            return FORMATS[self.scheme].group
        return self.group_size if self.scheme in WEIGHT_ONLY_INT else None


class RTNRecipe(GroupedRecipe):
    method: Literal[Method.rtn]


class GPTQRecipe(GroupedRecipe):
    method: Literal[Method.gptq]
    act_order: bool = Field(
        False,
        description="quantize columns in order of decreasing Hessian diagonal (static groups: no g_idx is stored)",
    )
    dampening_frac: float = Field(0.01, gt=0, lt=1, description="λ added to diag(H) as a fraction of its mean")


class AWQRecipe(GroupedRecipe):
    method: Literal[Method.awq]
    awq_grid: int = Field(20, ge=3, le=100, description="grid points searched per scale (llm-compressor's default 20)")


class SmoothQuantRecipe(_Quantized):
    method: Literal[Method.smoothquant]
    smoothing_strength: float = Field(0.8, description="migration strength α in (0, 1)")
    dampening_frac: float = Field(
        0.01, gt=0, lt=1, description="the GPTQ step after smoothing: λ as a fraction of mean diag(H)"
    )

    @field_validator("smoothing_strength")
    @classmethod
    def _strength(cls, a: float) -> float:
        if not 0 < a < 1:
            raise ValueError(
                f"smoothing_strength must lie strictly between 0 and 1 (got {a}); "
                "0.5 balances weights and activations, 0.8 suits models with strong activation outliers"
            )
        return a


class FP8Recipe(_Quantized):
    method: Literal[Method.fp8]

    @model_validator(mode="after")
    def _symmetric(self) -> FP8Recipe:
        if not self.symmetric:
            raise ValueError("FP8 scales are symmetric; remove `symmetric: false`")
        return self


class VerbatimRecipe(_Recipe):
    method: Literal[Method.llmcompressor]
    stages: dict[str, Any] | None = Field(None, description="an llm-compressor recipe section, given verbatim")

    @model_validator(mode="after")
    def _stages(self) -> VerbatimRecipe:
        if not self.stages:
            raise ValueError("method llmcompressor needs `stages:`, an llm-compressor recipe section given verbatim")
        if given := sorted({"targets", "ignore"} & self.model_fields_set):  # accepted and ignored (a review)
            raise ValueError(
                f"method llmcompressor takes its layers from `stages:`, so {' and '.join(given)} would change "
                "nothing; set them in the stages' modifiers, or remove them"
            )
        if self.calibration is None:  # an AttributeError after the load (a review)
            raise ValueError(
                "method llmcompressor runs its stages on calibration data: give a `calibration:` section (for "
                "example {source: builtin:jargon, samples: 64, seq_len: 256})"
            )
        return self

    @property
    def needs_calibration(self) -> bool:
        return True


GGUF_TYPE_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,31}")
# a tensor_types pattern's length: a search's tries name up to a few hundred blocks in one (blk\.(0|1|...)\.attn_);
# what a pattern costs is bounded by the time limit on its search (convert/gguf.first_patterns), not its length
MAX_PATTERN = 4000


class GGUFRecipe(_Named):
    """llama.cpp's own quantizer (`llama_model_quantize`) from a GGUF: the output is a GGUF of file type `type`, by the
    name llama.cpp's tools and the GGUFs people publish use (Q8_0, Q6_K, Q5_K_M, Q4_K_M, IQ4_XS, Q3_K_M). llama.cpp
    chooses each tensor's type from that file type itself (its own mixtures, and a type of smaller blocks where a
    tensor's rows hold no whole block), so the settings of the other methods (targets, ignore, dtype, streaming,
    offload) have no place here. `calibration:` is the one it shares: given, an importance matrix is computed from
    it in llama.cpp and the quantizer weighs each weight's columns by it (the file types in convert/gguf.IMATRIX
    need one)."""

    method: Literal[Method.gguf]
    backend: str = Field("llamacpp", min_length=1, description="the backend that converts: llamacpp")
    type: str = Field(description="llama.cpp's file type, e.g. Q4_K_M (LLAMA_FTYPE_MOSTLY_Q4_K_M)")
    threads: int | None = Field(
        None, ge=1, le=1024, description="threads llama.cpp quantizes with; default: this machine's CPUs"
    )
    calibration: Calibration | None = Field(
        None,
        description="text to compute an importance matrix from (as llama.cpp's llama-imatrix does), which the "
        "quantizer then weighs each weight's columns by; needed by the IQ1/IQ2/IQ3_XXS/IQ3_XS and Q2_K_S types",
    )
    tensor_types: dict[str, str] | None = Field(
        None,
        max_length=64,
        description="llama-quantize's --tensor-type: a pattern (a regular expression searched in each tensor's "
        "name, e.g. ffn_down or blk\\.[0-3]\\.attn_v) -> the ggml type its tensors take (Q6_K, Q8_0, ...), in "
        "place of the file type's mixture; the first pattern that matches decides; rows that hold no whole block "
        "of that type still fall back",
    )

    @field_validator("tensor_types", mode="before")
    @classmethod
    def _patterns(cls, v: Any) -> Any:
        """Each pattern a regular expression both Python and llama.cpp's std::regex (ECMAScript) read alike: it
        compiles here, and uses none of Python's own syntax ((?P<, (?<, (?#, inline flags); each type spelled as a
        ggml type (checked against llama.cpp by the backend)."""
        if not isinstance(v, dict):
            return v
        out = {}
        for pattern, kind in v.items():
            if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_PATTERN:
                raise ValueError(f"pattern {str(pattern)[:80]!r} must be text of 1 to {MAX_PATTERN} characters")
            compile_pattern(pattern, "tensor_types")
            if re.search(r"\(\?[^:=!]", pattern):
                raise ValueError(
                    f"pattern {pattern!r} uses a group syntax llama.cpp's regular expressions (ECMAScript) do not "
                    "read alike: use plain groups, (?:...), (?=...) or (?!...)"
                )
            if not isinstance(kind, str) or not GGUF_TYPE_NAME.fullmatch(name := kind.strip().upper()):
                raise ValueError(f"{pattern}: {kind!r} is not a ggml type name (Q6_K, Q8_0, IQ4_XS, F16, ...)")
            out[pattern] = name
        return out

    @model_validator(mode="before")
    @classmethod
    def _no_section(cls, v: Any) -> Any:
        # a `gguf:` key would be reported at no field (the method's tag, `gguf`, is left out of a key's name)
        if isinstance(v, dict) and "gguf" in v:
            raise ValueError(
                "`gguf:` is not a setting of method gguf: give llama.cpp's file type at the top level of the recipe, "
                "e.g. `type: Q4_K_M` (and `threads:` beside it)"
            )
        return v

    @field_validator("type", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        """The spelling only (upper case, LLAMA_FTYPE_MOSTLY_ dropped): the names llama.cpp knows are read from the
        installed library by the backend's check, before anything loads, so that this schema imports no llama.cpp."""
        if not isinstance(v, str):
            return v
        name = v.strip().upper().removeprefix("LLAMA_FTYPE_MOSTLY_")
        if not GGUF_TYPE_NAME.fullmatch(name):
            raise ValueError(
                "a GGUF type is one of llama.cpp's file type names, letters, digits and underscores (Q8_0, Q6_K, "
                "Q5_K_M, Q4_K_M, IQ4_XS, Q3_K_M)"
            )
        return name

    # what the engine and the API read of any recipe, fixed for this one (not settings: none may be given)
    @property
    def scheme_or_none(self) -> Scheme | None:
        return None

    @property
    def weight_group(self) -> int | None:
        return None

    @property
    def needs_calibration(self) -> bool:
        return self.calibration is not None

    @property
    def trust_remote_code(self) -> bool:
        return False

    @property
    def dtype(self) -> str | None:
        return None


class _SearchRecipeGiven(BaseModel):
    """A search recipe handed to `quantize run`: one message saying which command takes it."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, v: Any) -> Any:
        raise ValueError("this is a search recipe (it has `base:` and `budget:`); run it with `quantize search FILE`")


def _method(v: Any) -> str | None:
    """The union's tag: the method's name when it is one, else None (pydantic reports an unknown method)."""
    if isinstance(v, dict) and "base" in v and "budget" in v and "method" not in v:
        return "search"
    m = v.get("method") if isinstance(v, dict) else getattr(v, "method", None)
    if isinstance(m, Method):
        return m.value
    return m if isinstance(m, str) and m in {x.value for x in Method} else None


Recipe = Annotated[
    Annotated[RTNRecipe, Tag("rtn")]
    | Annotated[GPTQRecipe, Tag("gptq")]
    | Annotated[AWQRecipe, Tag("awq")]
    | Annotated[SmoothQuantRecipe, Tag("smoothquant")]
    | Annotated[FP8Recipe, Tag("fp8")]
    | Annotated[VerbatimRecipe, Tag("llmcompressor")]
    | Annotated[GGUFRecipe, Tag("gguf")]
    | Annotated[_SearchRecipeGiven, Tag("search")],
    Discriminator(
        _method,
        custom_error_type="invalid_method",
        custom_error_message="method is missing or unknown; choose one of: " + ", ".join(m.value for m in Method),
    ),
]
RECIPE = TypeAdapter(Recipe)
# Where a setting belongs, for the message when it is given to another method.
SETTING_OWNER = {
    "act_order": "act_order is a GPTQ setting",
    "dampening_frac": "dampening_frac is a GPTQ and SmoothQuant setting",
    "awq_grid": "awq_grid is an AWQ setting",
    "smoothing_strength": "smoothing_strength is a SmoothQuant setting",
    "stages": "`stages:` is only for method llmcompressor",
    "group_size": "group_size is for int weight schemes of rtn, gptq and awq; FP8 and W8A8 use one scale per output "
    "channel",
    "indivisible": "indivisible is for grouped int weight schemes of rtn, gptq and awq",
    "scheme": "method llmcompressor takes its scheme from `stages:`, method gguf its file type from `type:`",
    "type": "`type:` is llama.cpp's file type, method gguf's; the other methods name a `scheme:`",
    "threads": "`threads:` is method gguf's (llama.cpp's quantizer)",
    "targets": "llama.cpp chooses each tensor's type from the file type, `type:`",
    "ignore": "llama.cpp chooses each tensor's type from the file type, `type:`",
    "dtype": "llama.cpp reads the GGUF's own tensor types",
    "trust_remote_code": "no Python code of the checkpoint runs in llama.cpp",
    "streaming": "llama.cpp's quantizer reads and writes one tensor at a time itself",
    "offload": "llama.cpp's quantizer reads and writes one tensor at a time itself",
    "max_memory": "llama.cpp's quantizer reads and writes one tensor at a time itself; no memory plan is made",
    "base": "`base:` belongs to a search recipe: run it with `quantize search FILE`",
    "budget": "`budget:` belongs to a search recipe: run it with `quantize search FILE`",
    "symmetric": "method llmcompressor takes its scheme from `stages:`, method gguf its file type from `type:`",
}


def parse_recipe(data: Any, origin: str = "recipe") -> Recipe:
    """Validate a recipe mapping; raise UsageError listing every problem."""
    return validate(RECIPE, data, origin, "recipe", RECIPE_WORDING)


def load_recipe(path: str | Path) -> tuple[Recipe, str]:
    """Read and validate a recipe file. Returns the recipe and the sha256 of the file's bytes."""
    recipe, sha = load_yaml(path, RECIPE, "recipe", "the shipped recipes are in recipes/*.yaml", RECIPE_WORDING)
    if recipe.name is None:
        recipe.name = checked(
            Path(path).stem, f"recipe {path}: its name (the file's, as it sets no `name:`)", "set `name:` in it"
        )
    return recipe, sha


def resolved_dict(recipe: Recipe) -> dict[str, Any]:
    """The recipe with every default filled in: what quantize.json records."""
    return recipe.model_dump(mode="json")


METHOD_TAGS = frozenset(m.value for m in Method) | {"search"}
RECIPE_WORDING = Wording(skip_locs=METHOD_TAGS, tag_label="method {}", hints=SETTING_OWNER)
