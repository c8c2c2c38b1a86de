"""True bits per weight, read from safetensors headers only.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(name -> dtype, shape, data_offsets), then the tensor bytes. Everything this
module reports comes from those headers and from config.json: no model is
loaded, and the only tensor data read is the few bytes of each `weight_shape`
compressed-tensors stores beside a packed weight, so it answers in milliseconds
for any size.

    bits per weight = 8 × (bytes of every stored tensor) / (logical parameters)

Logical parameters unpack packed shapes: a 4-bit weight stored as int32 words
of shape (out, in/8) holds out × in parameters. Scales, zero points, group
indices and other quantization metadata are bytes but not parameters. A packed
weight's num_bits is checked against its storage first (_Count._unpacked): a
width its words cannot hold, or one that does not pack the weight's own shape
(its weight_shape, or its scales × group_size) into them, is refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quantize.checkpoint import architecture as arch
from quantize.checkpoint import ggufs
from quantize.checkpoint.files import index_matches_headers, read_config, safetensors_files, side_file
from quantize.checkpoint.headers import DTYPE_BITS, TensorInfo, all_tensors, small_ints
from quantize.compat import compressed_tensors_packing as packing
from quantize.compat import compressed_tensors_targets as ct
from quantize.errors import UsageError
from quantize.records import BitsRecord, ModuleBits

LOW_PRECISION_WEIGHT = {"I8", "U8", "F8_E4M3", "F8_E5M2", "F4"}

ROLES = (
    "payload",
    "scale",
    "zero_point",
    "group_index",
    "quant_meta",
    "kv_scale",
    "embedding",
    "lm_head",
    "norm",
    "bias",
    "linear_kept",
    "state",
    "conv",
    "scalar",
    "other",
)
QUANT_ROLES = ("payload", "scale", "zero_point", "group_index", "quant_meta")
# bytes that are not parameters: the quantized linears' metadata, and a quantized KV cache's scales
METADATA_ROLES = (*QUANT_ROLES[1:], "kv_scale")

MXFP4 = "mxfp4 g32"  # transformers' MXFP4 experts: FP4 E2M1 values, an E8M0 scale per 32
# Module names of an output layer that a config can tie to the input embeddings.
LM_HEADS = ("lm_head", "embed_out", "output")
UNTIED = "output layer untied:"  # how the note of an output layer a conversion untied begins (untied_head)
# Payload tensors whose last (compressed-tensors, AWQ) or first (GPTQ) axis is packed: into int32 words (int
# weights), or two FP4 E2M1 values a byte (uint8: compressed-tensors' nvfp4/mxfp4 pack-quantized). How
# compressed-tensors packs, and which num_bits go into which words, is compat/compressed_tensors_packing's.
PACKED_AXIS = {"weight_packed": -1, "qweight": 0}
PACKED_CONTAINERS = tuple(packing.CONTAINERS)
# config groups whose scales have one column per group_size weights of a row (the others: one per row or block)
GROUPED_STRATEGIES = ("group", "tensor_group")
FIX_BITS = (
    "fix num_bits in config.json's quantization_config (config_groups.*.weights, or `bits`) to the width the "
    "weights were packed with, or re-save the checkpoint with the tool that quantized it"
)


@dataclass
class ModuleRow:
    module: str
    format: str
    bytes: int = 0
    parameters: int = 0
    roles: dict[str, int] = field(default_factory=dict)

    @property
    def bits_per_weight(self) -> float | None:
        return 8 * self.bytes / self.parameters if self.parameters else None


@dataclass
class PartRow:
    """One part of the model (architecture.PARTS): every byte of its tensors, scales included; its parameters;
    and how many of those bytes are quantization metadata (scales, zero points, KV-cache scales)."""

    bytes: int = 0
    parameters: int = 0
    metadata_bytes: int = 0

    @property
    def bits_per_weight(self) -> float | None:
        return 8 * self.bytes / self.parameters if self.parameters else None


class ExpertLayer(BaseModel):
    """One MoE layer's routed experts as the headers hold them: all E experts' bytes and parameters together,
    and the experts seen (distinct `experts.N` indices, or the leading axis of fused 3-D expert tensors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layer: int
    bytes: int
    parameters: int
    experts_stored: int


class BitsReport(BitsRecord):
    """The one bits type: what quantize.json keeps (BitsRecord), plus what only a read of the files knows (the
    files, header bytes read, the checkpoint's own logical parameters, a stored copy of a tied output layer).
    Read alone, a checkpoint is its own source: source_parameters = parameters, and bits per weight divide by
    them; `as_record` divides by a source model's count instead."""

    checkpoint: str
    files: list[str]
    file_bytes: int
    header_bytes_read: int
    parameters: int | None
    quantized_linear_bytes: int
    # parameters of an lm_head stored although config.json ties it to the embeddings (a copy the model
    # does not need); bits per source parameter divide every byte by parameters − this
    tied_copy_parameters: int = 0
    # by part of the model (architecture.PARTS): bytes, parameters, metadata bytes, bits per weight; sums to the
    # total bytes
    bytes_by_part: dict[str, dict[str, Any]] = Field(default_factory=dict)
    expert_layers: list[ExpertLayer] = Field(default_factory=list)  # each MoE layer's routed experts, in order
    # a GGUF's: per ggml type its tensors, elements, bytes, block layout (the gguf package's GGML_QUANT_SIZES) and
    # bits per weight = type_size × 8 / block_size; and the alignment padding, so that header_bytes_read +
    # total_bytes + padding_bytes = file_bytes. Empty and 0 for safetensors, which have no padding.
    ggml_types: dict[str, dict[str, Any]] = Field(default_factory=dict)
    padding_bytes: int = 0
    # the embedding tables a decode step reads a row of per token, not whole: name -> (bytes, rows). An input
    # embedding beside a stored output layer, per-layer and position embeddings; a table the output layer is
    # tied to (none stored) is read whole by it every step and is not one of them (gathered_tables)
    gathered: dict[str, tuple[int, int]] = Field(default_factory=dict)

    @property
    def routed_expert_share(self) -> float | None:
        """The routed experts' share of all stored bytes (None for a model without routed experts)."""
        b = self.bytes_by_part.get("routed_experts", {}).get("bytes", 0)
        return b / self.total_bytes if b and self.total_bytes else None

    @property
    def bits_per_source_parameter(self) -> float | None:
        if not self.parameters or not self.tied_copy_parameters:
            return None
        return 8 * self.total_bytes / (self.parameters - self.tied_copy_parameters)

    def as_record(self, source_parameters: int | None) -> BitsRecord:
        """quantize.json's bits: bits per weight = 8 × total bytes / the source model's parameters (this
        checkpoint's own where the source's are unknown)."""
        params = source_parameters or self.parameters
        fields = BitsRecord.model_fields
        return BitsRecord(
            **{
                k: v
                for k, v in self.__dict__.items()
                if k in fields and k not in ("source_parameters", "bits_per_weight")
            },
            **{"source_parameters": params, "bits_per_weight": 8 * self.total_bytes / params if params else None},
        )

    def to_dict(self, modules: bool = True) -> dict[str, Any]:
        """`quantize inspect --json`."""
        keys = (
            "checkpoint",
            "format",
            "files",
            "file_bytes",
            "header_bytes_read",
            "total_bytes",
            "parameters",
            "bits_per_weight",
            "quantized_linear_bytes",
            "quantized_linear_parameters",
            "quantized_linear_bits_per_weight",
            "bytes_by_role",
            "bytes_by_part",
            "routed_expert_share",
        )
        return {
            **{k: getattr(self, k) for k in keys},
            "expert_layers": [e.model_dump() for e in self.expert_layers],
            "modules": [m.model_dump() for m in self.modules] if modules else None,
            "notes": self.notes,
            "tied_copy_parameters": self.tied_copy_parameters,
            "bits_per_source_parameter": self.bits_per_source_parameter,
            **({"ggml_types": self.ggml_types, "padding_bytes": self.padding_bytes} if self.ggml_types else {}),
        }


# --- quantization config: what the packed words hold ------------------------------------------


def _quant_config(checkpoint: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """The quantization settings: config.json's quantization_config, else a pre-integration layout's side file
    (AutoGPTQ's quantize_config.json, AutoAWQ's quant_config.json), read by the one side-file reader
    (files.side_file: AutoAWQ's keys renamed to transformers' "bits" and "group_size")."""
    qc: dict[str, Any] = {}
    for key in ("quantization_config", "compression_config"):
        value = cfg.get(key)
        if value is not None and not isinstance(value, dict):  # [] and 0 are no "unquantized" any more than 5
            raise UsageError(
                f"{checkpoint}: config.json's {key} is {_shown(value)}, not an object; re-save the checkpoint with "
                "the tool that quantized it, or remove the key from a model that is not quantized"
            )
        qc = qc or value or {}
    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    if not qc and (found := side_file(folder)) is not None:
        name, side = found
        qc = {**side, "_from": name}
    return qc


def _short(value: Any) -> str:
    return json.dumps(value, default=str)[:60] if not isinstance(value, (dict, list)) else type(value).__name__


def _shown(value: Any) -> str:
    return json.dumps(value, default=str)[:60]


def _bit_width(value: Any, where: str) -> int:
    """A bit width from a quantization config: an integer from 1 to 64, or a UsageError naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
        or not 1 <= value <= 64
    ):
        raise UsageError(f"config.json declares {where} = {_short(value)}; a bit width is a whole number from 1 to 64")
    return int(value)


def _format_name(qc: dict[str, Any]) -> str:
    if not qc:
        return "unquantized"
    method = qc.get("quant_method", "unknown")
    if method == "compressed-tensors":
        return f"compressed-tensors {qc.get('format', '?')}"
    return f"{method} ({qc['_from']})" if "_from" in qc else str(method)


def _packed_bits(qc: dict[str, Any]) -> set[int]:
    """The weight bit widths the config declares for packed tensors."""
    if qc.get("quant_method") == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
            raise UsageError("config.json's quantization_config.config_groups must map group names to objects")
        weights = [g.get("weights") or {} for g in groups.values()]
        if not all(isinstance(w, dict) for w in weights):
            raise UsageError("config.json's quantization_config.config_groups.*.weights must be objects")
        return {_bit_width(w["num_bits"], "config_groups.*.weights.num_bits") for w in weights if w.get("num_bits")}
    bits = qc.get("bits") or qc.get("w_bit")  # AutoAWQ's own key, which some of its versions write in config.json
    return {_bit_width(bits, "quantization_config.bits")} if bits else set()


def _bits_by_target(qc: dict[str, Any]) -> list[tuple[str, int]]:
    """(target, bit width) of each compressed-tensors config group's weights: a mixed-precision checkpoint
    names its layers (or `re:` patterns) per group."""
    out = []
    for g in (qc.get("config_groups") or {}).values() if qc.get("quant_method") == "compressed-tensors" else []:
        nb = (g.get("weights") or {}).get("num_bits")
        for t in g.get("targets") or []:
            if nb and isinstance(t, str):
                out.append((t, _bit_width(nb, "config_groups.*.weights.num_bits")))
    return out


def module_bits(module: str, targets: list[tuple[str, int]]) -> int | None:
    """The bit width of the config group whose target compressed-tensors applies to `module` (its name, else the
    first matching `re:` pattern in sorted order: compat/compressed_tensors_targets.first_target); None when no group
    names it."""
    bits = dict(targets)  # a target in two groups: the later one, as compressed-tensors' target -> scheme map
    t = ct.first_target(module, bits)
    return None if t is None else bits[t]


def scaled(module: str, names: set[str]) -> bool:
    """Whether the file stores a weight scale for `module` (compressed-tensors' `weight_scale`, a block-FP8
    checkpoint's `weight_scale_inv`): its weight is stored quantized."""
    return f"{module}.weight_scale" in names or f"{module}.weight_scale_inv" in names


def role_of(name: str, tensor: TensorInfo, names: set[str]) -> str:
    """A tensor's role, by its name (architecture.ROLE_RULES, first match: arch.rule_role) and, for a `.weight`,
    its dtype and neighbours: an 8-bit weight stored beside its scale is a quantized linear's payload whatever its
    module (checked first: a quantized lm_head, `ignore: []`, was role `lm_head`, its payload counted as an
    unquantized head's and its parameters left out of the quantized linears')."""
    if name.endswith(".weight"):
        module = name[: -len(".weight")]
        if tensor.dtype in LOW_PRECISION_WEIGHT and scaled(module, names):
            return "payload"  # int-quantized / float-quantized: the weight itself is the 8-bit payload
    if (role := arch.rule_role(name)) is not None:
        return role
    if name.endswith(".weight"):
        return "linear_kept" if len(tensor.shape) == 2 else "other"
    return "other"


def metadata_only(row: ModuleRow | ModuleBits) -> bool:
    """Whether a module holds only bytes that are no parameters (METADATA_ROLES: a quantized KV cache's k_scale and
    v_scale on an attention module whose projections are modules of their own): no format, no bits per weight."""
    return bool(row.roles) and set(row.roles) <= set(METADATA_ROLES)


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


# --- the report ---------------------------------------------------------------------------------


class _Count:
    """Bytes by role and by module, and logical parameters, tensor by tensor."""

    def __init__(
        self,
        tensors: dict[str, TensorInfo],
        bits: set[int],
        linear_layers: frozenset[int] = frozenset(),
        mtp: arch.Mtp | None = None,
    ):
        self.tensors = tensors
        self.names = set(tensors)
        # module -> the shape compressed-tensors stored beside its packed weight (`weight_shape`, read by bits_report)
        self.stored_shapes: dict[str, list[int]] = {}
        self.linear_layers = linear_layers  # layers config.json makes linear attention (architecture.part_of)
        self.mtp = mtp  # the multi-token-prediction module config.json describes (architecture.part_of)
        self.bits = bits
        self.by_target: list[tuple[str, int]] = []
        self.args: list[tuple[str, dict[str, Any]]] = []  # (target, weights arguments) of the config groups
        self.notes: list[str] = []
        self.by_role = dict.fromkeys(ROLES, 0)
        self.modules: dict[str, ModuleRow] = {}
        self.weights: dict[str, int] = {}  # module -> parameters of its payload (a bias is not a quantized weight)
        self.params_known = True
        self.parts = {p: PartRow() for p in arch.PARTS}
        self.experts: dict[int, _Experts] = {}  # layer -> its routed experts

    def add(self, name: str, t: TensorInfo) -> None:
        role = role_of(name, t, self.names)
        self.by_role[role] += t.nbytes
        row = self.modules.setdefault(_module_of(name), ModuleRow(_module_of(name), format="?"))
        row.bytes += t.nbytes
        row.roles[role] = row.roles.get(role, 0) + t.nbytes
        part = self.parts[p := arch.part_of(row.module, role, self.linear_layers, self.mtp)]
        part.bytes += t.nbytes
        experts = self._experts(name, row.module, t) if p == "routed_experts" else None
        if experts is not None:
            experts.bytes += t.nbytes
        if role in METADATA_ROLES:
            part.metadata_bytes += t.nbytes
            return  # metadata: bytes, not parameters
        before = row.parameters
        self._count_parameters(name, t, role, row)
        part.parameters += row.parameters - before
        if experts is not None:
            experts.parameters += row.parameters - before

    def _experts(self, name: str, module: str, t: TensorInfo) -> _Experts | None:
        """The routed-expert tally of the tensor's layer (None outside the decoder layers), with the expert seen."""
        layer = arch.layer_index(name)
        if layer is None:
            return None
        e = self.experts.setdefault(layer, _Experts())
        if (i := arch.expert_index(module)) is not None:
            e.indices.add(i)
        elif len(t.shape) >= 2:  # a fused tensor: experts along its leading axis
            e.fused.add(t.shape[0])
        return e

    def _count_parameters(self, name: str, t: TensorInfo, role: str, row: ModuleRow) -> None:
        n = math.prod(t.shape)
        if role == "payload" and name.rsplit(".", 1)[-1] in PACKED_AXIS:
            b = self._packed_width(name, t, row)
            if b is None:
                return
            n = self._unpacked(name, t, row, b)
            row.format = f"{'fp' if self._float_weights(row) else 'int'}{b}"
        elif role == "payload" and name.endswith("_blocks") and t.dtype == "U8":
            n *= 2  # MXFP4 blocks: two FP4 values a byte (they were counted one a byte, scales as parameters)
            row.format = MXFP4
        elif role == "payload" or row.format == "?":
            row.format = t.dtype.lower()
        row.parameters += n
        if role == "payload":
            self.weights[row.module] = self.weights.get(row.module, 0) + n

    def _packed_width(self, name: str, t: TensorInfo, row: ModuleRow) -> int | None:
        """Bits per value of an int32-packed payload, or None (noted; its parameters uncounted) when unknown."""
        mixed = module_bits(row.module, self.by_target) if self.by_target else None
        if t.dtype not in PACKED_CONTAINERS or (len(self.bits) != 1 and mixed is None) or len(t.shape) != 2:
            self.params_known = False
            bits = self.bits
            why = (
                f"the config declares bit widths {sorted(bits)}"
                if bits
                else "config.json declares no quantization bit width"
            )
            self.notes.append(f"cannot unpack {name} ({t.dtype} {t.shape}): {why}; its parameters are not counted")
            return None
        return mixed or next(iter(self.bits))

    def _unpacked(self, name: str, t: TensorInfo, row: ModuleRow, b: int) -> int:
        """The values packed payload `name` holds at `b` bits a value, `b` (config.json's) first checked against
        the storage, a UsageError where they disagree: GPTQ's and AWQ's int32 words must hold a whole number of
        b-bit values; compressed-tensors must pack b-bit values into words of this dtype (compat's CONTAINERS),
        and the weight's row, as its `weight_shape` gives it (then counted exactly) or else as its scales ×
        group_size bound it, must pack at b bits into the words stored (compat's packed_width). Elsewhere each
        word holds its bits / b values. A num_bits of 64, 3 or 8 on int4 words counted 66, 3.1 or 8.3 bits per
        quantized weight (a review)."""
        word, n = DTYPE_BITS[t.dtype], math.prod(t.shape)
        if not name.endswith(".weight_packed"):  # GPTQ's or AWQ's qweight
            if b > word or n * word % b:
                raise UsageError(
                    f"{name} is {t.dtype} {t.shape}: its {n:,} {word}-bit words hold no whole number of {b}-bit "
                    f"values, and config.json's quantization_config declares {b} bits; {FIX_BITS}"
                )
            return n * word // b
        if not packing.packable(t.dtype, b):
            _, widths, packer, words = packing.CONTAINERS[t.dtype]
            can = f"{widths[0]}" if len(widths) == 1 else f"{widths[0]} to {widths[-1]}"
            raise UsageError(
                f"{name} is {t.dtype} {t.shape}, and config.json's quantization_config gives its weights num_bits "
                f"{b}; compressed-tensors packs {can} bits a value into {words} ({packer}), never {b}: the storage "
                f"does not hold {b}-bit values. {FIX_BITS[0].upper()}{FIX_BITS[1:]}"
            )
        if (shape := self.stored_shapes.get(row.module)) is not None:
            if shape[:-1] != t.shape[:-1]:
                raise UsageError(
                    f"{name} is {t.dtype} {t.shape}, but the weight_shape stored beside it is {shape}: their rows "
                    "differ, so the checkpoint contradicts itself; re-save it with the tool that quantized it"
                )
            self._check_row(name, t, b, shape[-1], shape[-1], f"its weight_shape {shape}")
            return math.prod(shape)
        if (grouped := self._grouped_row(row.module, t)) is not None:
            self._check_row(name, t, b, *grouped)
        return n * word // b

    def _check_row(self, name: str, t: TensorInfo, b: int, low: int, high: int, source: str) -> None:
        """A UsageError unless a row of `low` to `high` values (what `source` says) packs at `b` bits into the
        words stored, naming the num_bits that would."""
        words = t.shape[-1]
        if b in (fits := packing.fitting_bits(low, high, words, t.dtype)):
            return
        cols = f"{high:,}" if low == high else f"{low:,} to {high:,}"
        need = [packing.packed_width(c, b, t.dtype) for c in (low, high)]
        implied = (
            f"the storage holds num_bits {' or '.join(map(str, fits))}"
            if fits
            else "no num_bits compressed-tensors packs fits the storage"
        )
        raise UsageError(
            f"{name} is {t.dtype} {t.shape}, and config.json's quantization_config gives its weights num_bits {b}; "
            f"but {source} says a row holds {cols} values, which pack at {b} bits into "
            f"{need[0] if need[0] == need[1] else f'{need[0]} to {need[1]}'} {packing.CONTAINERS[t.dtype][3]}, not "
            f"{words}: {implied}. "
            f"{FIX_BITS[0].upper()}{FIX_BITS[1:]}"
        )

    def _grouped_row(self, module: str, t: TensorInfo) -> tuple[int, int, str] | None:
        """The values a row of a grouped payload holds as its scales bound them: G scale columns of group_size g
        each cover (G − 1)·g + 1 to G·g values (the library itself takes G·g); None where the config group is not
        grouped or the scale does not match the payload's rows."""
        args = _weight_args(self.args, module)
        scale = self.tensors.get(f"{module}.weight_scale")
        sizes = {w.get("group_size") for w in args}
        if scale is None or not args or any(w.get("strategy") not in GROUPED_STRATEGIES for w in args):
            return None
        g = sizes.pop() if len(sizes) == 1 else None
        if type(g) is not int or g <= 0 or len(scale.shape) != len(t.shape) or scale.shape[:-1] != t.shape[:-1]:
            return None
        groups = scale.shape[-1]
        if groups == 0:
            return None
        return (groups - 1) * g + 1, groups * g, f"its weight_scale {scale.shape} × group_size {g}"

    def _float_weights(self, row: ModuleRow) -> bool:
        """Whether the config declares float (FP4) rather than int weights for this module's group."""
        return {w.get("type") for w in _weight_args(self.args, row.module)} == {"float"}


@dataclass
class _Experts:
    bytes: int = 0
    parameters: int = 0
    indices: set[int] = field(default_factory=set)
    fused: set[int] = field(default_factory=set)

    def stored(self) -> int:
        """Experts the headers hold: distinct indices, else the fused tensors' leading axis (0 when they
        disagree, which the cost model then refuses)."""
        if self.indices:
            return len(self.indices) if not self.fused else 0
        return next(iter(self.fused)) if len(self.fused) == 1 else 0


def _config_weights(qc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(target, weights arguments) of each compressed-tensors config group (type, strategy, block_structure), the
    fields read here checked first: `targets: 5`, a `type` list and a block_structure of strings were exit 3 (a
    review); each is now a UsageError naming the group and field."""
    groups = qc.get("config_groups") if qc.get("quant_method") == "compressed-tensors" else None
    out = []
    for name, g in groups.items() if isinstance(groups, dict) else ():
        w = g.get("weights") if isinstance(g, dict) else None
        targets = g.get("targets") if isinstance(g, dict) else None
        where = f"config.json's quantization_config.config_groups.{name}"
        if targets is not None and not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
            raise UsageError(
                f"{where}.targets is {_shown(targets)}; compressed-tensors takes a list of module names or `re:` "
                "patterns. Re-save the checkpoint with the tool that quantized it"
            )
        if isinstance(w, dict):
            _check_weight_args(w, f"{where}.weights")
            out += [(t, w) for t in targets or []]
    return out


def _check_weight_args(w: dict[str, Any], where: str) -> None:
    """The weights arguments accounting reads: `type` and `strategy` strings, `group_size` a whole number,
    `block_structure` two whole numbers."""
    for key in ("type", "strategy"):
        if w.get(key) is not None and not isinstance(w[key], str):
            raise UsageError(f"{where}.{key} is {_shown(w[key])}, not a string; re-save the checkpoint")
    if w.get("group_size") is not None and type(w["group_size"]) is not int:
        raise UsageError(f"{where}.group_size is {_shown(w['group_size'])}, not a whole number; re-save the checkpoint")
    bs = w.get("block_structure")
    if bs is not None and not (isinstance(bs, list) and len(bs) == 2 and all(type(x) is int and x > 0 for x in bs)):
        raise UsageError(
            f"{where}.block_structure is {_shown(bs)}; it is [rows, cols] of a block, two whole numbers. Re-save the "
            "checkpoint with the tool that quantized it"
        )


def _weight_args(args: list[tuple[str, dict[str, Any]]], module: str) -> list[dict[str, Any]]:
    """The weights arguments of the group compressed-tensors applies to `module` (by name or `re:`:
    compat/compressed_tensors_targets.first_target), else of every group."""
    by_target = dict(args)
    t = ct.first_target(module, by_target)
    return [by_target[t]] if t is not None else [w for _, w in args]


def _tied_copy(cfg: dict[str, Any], modules: dict[str, ModuleRow], by_role: dict[str, int], notes: list[str]) -> int:
    """Parameters of an output layer stored although config.json ties it to the embeddings (noted), else 0."""
    heads = [m for m in modules.values() if m.module.rsplit(".", 1)[-1] in LM_HEADS]
    if not (cfg.get("tie_word_embeddings") is True and heads and by_role["embedding"]):
        return 0
    tied_copy = sum(m.parameters for m in heads)
    notes.append(
        f"config.json ties the output layer to the embeddings, yet {heads[0].module} is stored too "
        f"({sum(m.bytes for m in heads):,} bytes, {tied_copy:,} parameters): the copy counts in the total, and "
        "bits per source parameter leave its parameters out"
    )
    return tied_copy


def untied_head(source: Path, report: BitsReport) -> tuple[int, str | None]:
    """An output layer the conversion stored of its own where the source stores none (its config ties it to the
    input embeddings, and the recipe quantized it: `ignore: []`; llm-compressor unties the pair to quantize the head,
    and save_pretrained writes tie_word_embeddings false): its parameters, which the output holds and the source
    did not, and the note saying so; (0, None) otherwise. Read from both folders' safetensors headers."""
    stored = {_module_of(n) for n in all_tensors(safetensors_files(source))[0]}
    heads = [m for m in report.modules if m.module.rsplit(".", 1)[-1] in LM_HEADS and m.module not in stored]
    if not heads:
        return 0, None
    tied = read_config(Path(report.checkpoint), required=False).get("tie_word_embeddings")
    params, nbytes = sum(m.parameters for m in heads), sum(m.bytes for m in heads)
    return params, (
        f"{UNTIED} the source stores no {heads[0].module} of its own (its config ties the output layer to the input "
        f"embeddings) and the recipe quantizes it (not in `ignore`), so this checkpoint stores {heads[0].module} "
        f"({nbytes:,} bytes, {params:,} parameters: a quantized copy of the embeddings) and its config.json has "
        f"tie_word_embeddings {json.dumps(tied)}: bits per weight divide by its parameters too, the source's "
        f"{report.parameters - params:,} plus these. Add "
        f"'{heads[0].module}' to the recipe's `ignore` to keep the output layer tied"
    )


def _stored_shapes(files: list[Path], tensors: dict[str, TensorInfo]) -> dict[str, list[int]]:
    """Module -> the shape compressed-tensors' pack-quantized compressor stored beside its packed weight
    (`weight_shape`, int64, one value a dimension): the few bytes of tensor data the accounting reads. An empty or
    non-integer one is left out (the scales bound the row instead)."""
    stored = [
        t
        for n, t in tensors.items()
        if n.endswith(".weight_shape")
        and f"{n.removesuffix('.weight_shape')}.weight_packed" in tensors
        and len(t.shape) == 1
        and t.shape[0] > 0
    ]
    values = small_ints({f.name: f for f in files}, stored)
    return {n.removesuffix(".weight_shape"): v for n, v in values.items()}


def bits_report(checkpoint: str | Path) -> BitsReport:
    """Account for every byte of a checkpoint from its safetensors headers, or a GGUF's (ggufs.find says which)."""
    ckpt = Path(checkpoint)
    if (gguf_file := ggufs.find(ckpt)) is not None:
        return gguf_report(ckpt, ggufs.read_header(gguf_file))
    files = safetensors_files(ckpt)
    tensors, header_read = all_tensors(files)
    index_matches_headers(ckpt, tensors)  # a stored tensor the index leaves out is one no loader reads (run: exit 2)
    cfg = read_config(ckpt, required=False)
    qc = _quant_config(ckpt, cfg)
    mtp_module = arch.mtp_of(cfg)
    count = _Count(tensors, _packed_bits(qc), arch.linear_attention_layers(cfg), mtp_module)
    count.by_target = _bits_by_target(qc) if len(count.bits) > 1 else []
    count.stored_shapes = _stored_shapes(files, tensors)
    count.args = _config_weights(qc)
    for name, t in sorted(tensors.items()):
        count.add(name, t)
    modules, by_role, notes = count.modules, count.by_role, count.notes
    for row in modules.values():
        if metadata_only(row):  # a quantized KV cache's scales on its attention module: their role names the row
            row.format = "+".join(row.roles)
            continue
        if row.format == MXFP4:
            continue  # its group is the format's own
        if "payload" in row.roles and (b := _block(row, count.args)):
            row.format += f" block {b[0]}x{b[1]}"
        elif "payload" in row.roles:
            g = _group_size(row, tensors, count.weights.get(row.module, row.parameters))
            row.format += f" g{g}" if g else " per-channel"
    total = sum(t.nbytes for t in tensors.values())
    qlin = [m for m in modules.values() if "payload" in m.roles]
    q_bytes = sum(sum(v for r, v in m.roles.items() if r in QUANT_ROLES) for m in qlin)
    q_params = sum(count.weights.get(m.module, 0) for m in qlin)
    params = sum(m.parameters for m in modules.values()) if count.params_known else None
    unknown = [n for n, t in tensors.items() if role_of(n, t, count.names) == "other"]
    if unknown:
        notes.append(f"{len(unknown)} tensor(s) of unknown role counted as unquantized: {', '.join(unknown[:5])}")
    tied_copy = _tied_copy(cfg, modules, by_role, notes)
    if (mtp := count.parts["mtp"]).bytes:
        notes.append(mtp_note(cfg, mtp_parts(mtp_module, tensors), mtp.bytes, mtp.parameters))
    tables = [  # the decoder's: an MTP layer's own embedding is not read by a plain decode step
        (n, t.nbytes, t.shape[0])
        for n, t in tensors.items()
        if len(t.shape) == 2
        and role_of(n, t, count.names) == "embedding"
        and arch.part_of(_module_of(n), "embedding", mtp=mtp_module) != "mtp"
    ]
    if "_from" in qc:
        notes.append(f"bit width read from {qc['_from']} (config.json has no quantization_config)")
    return BitsReport(
        checkpoint=str(ckpt),
        format=_format_name(qc),
        files=[f.name for f in files],
        file_bytes=sum(f.stat().st_size for f in files),
        header_bytes_read=header_read,
        notes=notes,
        tied_copy_parameters=tied_copy,
        gathered=gathered_tables(tables, count.parts["lm_head"].bytes > 0),
        **_bits_fields(total, params, q_bytes, q_params),
        **_table_fields(by_role, modules, count.parts, count.experts),
    )


def mtp_parts(mtp: arch.Mtp, names: Iterable[str]) -> tuple[list[int], list[str]]:
    """The multi-token-prediction module's parts among tensor `names`: its layers after the decoder's (their
    indices) and its prefixes of their own (`mtp`), each in order."""
    held = [n for n in names if mtp.holds(n)]
    layers = sorted({i for n in held if mtp.in_layers(n) and (i := arch.layer_index(n)) is not None})
    return layers, sorted({mtp.prefix(n) for n in held if mtp.in_prefix(n)})


def mtp_note(cfg: dict[str, Any], stored: tuple[list[int], list[str]], nbytes: int, parameters: int) -> str:
    """What the accounting says of the multi-token-prediction module a checkpoint stores (`stored`: mtp_parts, part
    `mtp`): its layers after the decoder's, as config.json declares them, and its tensors under a prefix of their
    own, as the family's transformers model ignores them."""
    layers, prefixes = stored
    said = []
    if layers:
        declared = arch.mtp_layers(cfg)
        which = f"layer {layers[0]}" if len(layers) == 1 else f"layers {', '.join(map(str, layers))}"
        said.append(
            f"{which}: multi-token-prediction (MTP), as config.json declares (num_nextn_predict_layers "
            f"{len(declared)} after num_hidden_layers {declared.start})"
        )
    if prefixes:
        mtp = arch.mtp_of(cfg)
        said.append(
            f"{', '.join(p + '.*' for p in prefixes)}: multi-token-prediction (MTP) module, as transformers' "
            f"{mtp.family} model ignores it ({', '.join(p.pattern for p in mtp.patterns)})"
        )
    return (
        f"{'; '.join(said)}: part `mtp` ({nbytes:,} bytes, {parameters:,} parameters), no decoder layer; "
        "transformers' causal LM does not load it, and a plain decode step does not read it"
    )


# the token embeddings an output layer can be tied to (architecture.ROLE_RULES' embedding names less the per-layer
# and position tables, which no output layer reads)
TOKEN_TABLE = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings|embeddings|token_embd)\.weight$")


def gathered_tables(tables: list[tuple[str, int, int]], output_stored: bool) -> dict[str, tuple[int, int]]:
    """Of the embedding tables (name, bytes, rows), those a decode step reads one row of per token (a lookup): all
    of them where an output layer of its own is stored, else all but the token embedding, which the tied output
    layer reads whole every step. The decode bounds counted every table whole: twice the read of a small model
    with a large vocabulary, about 6.5% of Llama 3 8B's (a review)."""
    return {n: (b, r) for n, b, r in tables if r > 0 and (output_stored or not TOKEN_TABLE.search(n))}


def _bits_fields(total: int, params: int | None, q_bytes: int, q_params: int) -> dict[str, Any]:
    """A BitsReport's bytes, parameters and bits per weight (whole model: 8 × bytes / parameters; quantized
    linears: 8 × their payload and quantization bytes / their parameters), None where nothing is counted."""
    return dict(
        total_bytes=total,
        parameters=params,
        source_parameters=params,
        bits_per_weight=8 * total / params if params else None,
        quantized_linear_bytes=q_bytes,
        quantized_linear_parameters=q_params,
        quantized_linear_bits_per_weight=8 * q_bytes / q_params if q_params else None,
    )


def _table_fields(
    by_role: dict[str, int], modules: dict[str, Any], parts: dict[str, Any], experts: dict[int, Any]
) -> dict[str, Any]:
    """A BitsReport's tables: bytes by role and by part (those that hold bytes), modules in natural order, expert
    layers by layer."""
    return dict(
        bytes_by_role={r: v for r, v in by_role.items() if v},
        modules=[
            ModuleBits(**asdict(m), bits_per_weight=m.bits_per_weight)
            for m in sorted(modules.values(), key=lambda m: _natural_key(m.module))
        ],
        bytes_by_part={p: {**asdict(r), "bits_per_weight": r.bits_per_weight} for p, r in parts.items() if r.bytes},
        expert_layers=[
            ExpertLayer(layer=i, bytes=e.bytes, parameters=e.parameters, experts_stored=e.stored())
            for i, e in sorted(experts.items())
        ],
    )


def gguf_report(checkpoint: Path, h: ggufs.GGUFHeader) -> BitsReport:
    """A GGUF's bits from its header (ggufs.read_header): each tensor's bytes by the library's block arithmetic,
    its role and part from the tensor names the library gives its architecture (ggufs.role_of). A quantized
    tensor's bytes hold its scales inside each block, so its role is `payload` and its bits per weight are the
    type's own (Q4_0: 18 bytes per 32 weights = 4.5)."""
    patterns = ggufs.name_patterns(h.architecture)
    mtp = ggufs.mtp_blocks(h)
    stored = {t.name for t in h.tensors}
    roles = [(t, ggufs.role_of(t, patterns, stored, mtp.start if mtp else None)) for t in h.tensors]
    by_role = dict.fromkeys(ROLES, 0)
    parts = {p: PartRow() for p in arch.PARTS}
    modules: dict[str, ModuleRow] = {}
    experts: dict[int, _Experts] = {}
    for t, r in roles:
        by_role[r.role] += t.nbytes
        row = modules.setdefault(_module_of(t.name), ModuleRow(_module_of(t.name), format=t.ggml_type))
        row.format = t.ggml_type if t.name.endswith(".weight") else row.format  # the weight's type, not its bias's
        row.bytes, row.parameters = row.bytes + t.nbytes, row.parameters + t.elements
        row.roles[r.role] = row.roles.get(r.role, 0) + t.nbytes
        part = parts[r.part]
        part.bytes, part.parameters = part.bytes + t.nbytes, part.parameters + t.elements
        if r.part == "routed_experts" and r.layer is not None:
            e = experts.setdefault(r.layer, _Experts())
            e.bytes, e.parameters = e.bytes + t.nbytes, e.parameters + t.elements
            e.fused.add(t.dims[-1])  # fused experts (ffn_*_exps): the outermost ggml dimension counts them
    total = h.tensor_bytes
    params = sum(t.elements for t in h.tensors)
    payload = [t for t, r in roles if r.role == "payload"]  # a bias beside a quantized weight is not one
    q_bytes, q_params = sum(t.nbytes for t in payload), sum(t.elements for t in payload)
    unknown = [t.name for t, r in roles if r.kind is None]
    notes = (
        [
            f"{len(unknown)} tensor(s) not named by the gguf package's tensor names, counted as other: "
            f"{', '.join(unknown[:5])}"
        ]
        if unknown
        else []
    ) + ([matrix] if (matrix := ggufs.imatrix_note(h)) else [])
    if parts["mtp"].bytes:
        notes.append(gguf_mtp_note(h, ggufs.mtp_stored(h), parts["mtp"].bytes, parts["mtp"].parameters))
    return BitsReport(
        checkpoint=str(checkpoint),
        format=_gguf_format(h),
        files=[f.name for f in h.files],
        file_bytes=h.file_bytes,
        header_bytes_read=h.header_bytes,
        notes=notes,
        **_bits_fields(total, params, q_bytes, q_params),
        **_table_fields(by_role, modules, parts, experts),
        ggml_types=_ggml_types(h.tensors),
        padding_bytes=h.padding_bytes,
        gathered=gathered_tables(
            [
                (t.name, t.nbytes, t.dims[-1])
                for t, r in roles
                if r.role == "embedding" and r.part != "mtp" and len(t.dims) == 2
            ],
            by_role["lm_head"] > 0,
        ),
    )


def gguf_mtp_note(h: ggufs.GGUFHeader, stored: list[int], nbytes: int, parameters: int) -> str:
    """What the accounting says of the multi-token-prediction blocks a GGUF stores (`stored`, part `mtp`), as
    mtp_note says it of config.json's."""
    import gguf

    arch, blocks = h.architecture or "", ggufs.mtp_blocks(h)
    which = f"block {stored[0]}" if len(stored) == 1 else f"blocks {', '.join(map(str, stored))}"
    return (
        f"{which}: multi-token-prediction (MTP), as the header declares "
        f"({gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)} {len(blocks)} of "
        f"{gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)} {blocks.stop}): part `mtp` ({nbytes:,} bytes, "
        f"{parameters:,} parameters), no decoder layer; a plain decode step does not read it"
    )


def _ggml_types(tensors: list[ggufs.GGUFTensor]) -> dict[str, dict[str, Any]]:
    """Per ggml type, most bytes first: tensors, elements, bytes, its block layout and bits per weight."""
    out: dict[str, dict[str, Any]] = {}
    for t in tensors:
        ty = out.setdefault(
            t.ggml_type,
            {
                "tensors": 0,
                "elements": 0,
                "bytes": 0,
                "block_size": t.block_size,
                "type_size": t.type_size,
                "bits_per_weight": 8 * t.type_size / t.block_size,
            },
        )
        ty["tensors"] += 1
        ty["elements"] += t.elements
        ty["bytes"] += t.nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["bytes"]))


def _gguf_format(h: ggufs.GGUFHeader) -> str:
    """`gguf` and the file type llama.cpp's converter declares (general.file_type: MOSTLY_Q4_1, ...)."""
    import gguf

    ft = h.metadata.get(gguf.Keys.General.FILE_TYPE)
    try:
        return f"gguf {gguf.LlamaFileType(ft).name}" if isinstance(ft, int) else "gguf"
    except ValueError:
        return f"gguf (file type {ft})"


def _group_size(row: ModuleRow, tensors: dict[str, TensorInfo], weights: int) -> int | None:
    """Weights per scale along the input axis, from the scale's shape and the module's weight parameters
    (`weights`: its payload's, not its bias's, which made a biased int4 g128 linear "per-channel": a review);
    None for per-channel (a block format's layout comes from its config group instead: _block)."""
    for scale_name, in_axis in ((f"{row.module}.weight_scale", -1), (f"{row.module}.scales", 0)):
        s = tensors.get(scale_name)
        if s is None or len(s.shape) != 2:
            continue
        groups = s.shape[in_axis]
        out = s.shape[0] if in_axis == -1 else s.shape[1]
        if groups > 1 and weights and weights % (out * groups) == 0:
            return weights // (out * groups)
    return None


def _block(row: ModuleRow, args: list[tuple[str, dict[str, Any]]]) -> tuple[int, int] | None:
    """(rows, cols) of a block-quantized weight's blocks, from its config group (strategy block)."""
    for w in _weight_args(args, row.module):
        bs = w.get("block_structure")
        if w.get("strategy") == "block" and isinstance(bs, list) and len(bs) == 2:
            return int(bs[0]), int(bs[1])
    return None


def _natural_key(s: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def parameter_count(checkpoint: str | Path) -> int | None:
    return bits_report(checkpoint).parameters
