"""Layer groups and their true bytes per option, from a meta-device model and the source's safetensors headers.

A unit is a group of Linear layers that gets one option: with `unit: block-part` the Linears under one
parent module (a block's attention, a block's MLP), with `unit: layer` each Linear. Bytes of a Linear
W (out × in) as compressed-tensors stores it (pack-quantized, symmetric; tests compare with the written
checkpoint's headers):

    keep (16-bit)     the source tensor's bytes
    b-bit, group g    weight_packed  int32 (out, ⌈in·b/32⌉)   4·out·⌈in·b/32⌉
                      weight_scale   saved dtype (out, ⌈in/g⌉)  s·out·⌈in/g⌉   (g = in: one per channel)
                      weight_shape   int64 (2,)                 16

Everything else (embeddings, norms, biases, layers the base recipe does not target) is fixed bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantize.checkpoint.files import safetensors_files
from quantize.checkpoint.headers import FLOATS, read_header
from quantize.convert.plan import divisor_group
from quantize.convert.recipe import WEIGHT_ONLY_INT, Indivisible, RTNRecipe, Scheme
from quantize.errors import UsageError


@dataclass
class Linear:
    name: str
    out_features: int
    in_features: int
    source_bytes: int  # of its weight in the source checkpoint
    group: int | None  # weights per scale the base recipe gives it; None: per channel
    fixed: bool = False  # the base recipe keeps it at 16 bits whatever the option (indivisible: keep)


@dataclass
class Unit:
    name: str
    linears: list[Linear]
    bytes: dict[str, int] = field(default_factory=dict)  # option -> true bytes of its Linears' weights

    @property
    def parameters(self) -> int:
        return sum(lin.out_features * lin.in_features for lin in self.linears)


def option_name(o: Scheme | str) -> str:
    return o.value if isinstance(o, Scheme) else o


def linear_bytes(lin: Linear, option: str, scale_bytes: int) -> int:
    if option == "keep" or lin.fixed:
        return lin.source_bytes
    b = WEIGHT_ONLY_INT[Scheme(option)]
    g = lin.group or lin.in_features
    return (
        4 * lin.out_features * math.ceil(lin.in_features * b / 32)
        + scale_bytes * lin.out_features * math.ceil(lin.in_features / g)
        + 16
    )


@dataclass
class Layout:
    """The model as the search sees it: units with bytes per option, and the bytes no option changes."""

    units: list[Unit]
    fixed_bytes: int
    source_parameters: int

    def bits(self, total_bytes: int) -> float:
        return 8 * total_bytes / self.source_parameters

    def total(self, allocation: dict[str, str]) -> int:
        return self.fixed_bytes + sum(u.bytes[allocation[u.name]] for u in self.units)

    @property
    def smallest_bytes(self) -> int:
        """The whole model with every unit at its smallest option."""
        return self.fixed_bytes + sum(min(u.bytes.values()) for u in self.units)

    def budget_bytes(self, bits: float) -> int:
        return math.floor(bits * self.source_parameters / 8)


def layout(model: Any, model_dir: Path, base: RTNRecipe, options: list[str], unit: str) -> Layout:
    """Units and byte counts of a meta-device model whose source checkpoint is `model_dir`."""
    import torch
    from compressed_tensors.utils.match import match_named_modules

    tensors: dict[str, Any] = {}
    for f in safetensors_files(model_dir):
        tensors |= read_header(f)[0]
    total = sum(t.nbytes for t in tensors.values())
    params = sum(math.prod(t.shape) for t in tensors.values())
    # the bytes below are the source's stored ones: a save dtype of another size moves them (a float32 one does
    # not: work in float32 is cast back to the source's dtype on save, convert/dtypes.cast_saved_floats)
    if base.dtype is not None and base.dtype != "float32":
        size = getattr(torch, base.dtype).itemsize
        other = sorted(
            {t.dtype for t in tensors.values() if t.dtype in FLOATS and t.nbytes != size * math.prod(t.shape)}
        )
        if other:
            raise UsageError(
                f"the search's base sets dtype: {base.dtype}, and {model_dir} stores {', '.join(other)} tensors: the "
                "tries would write the tensors they keep in another size than the source's, which the byte model "
                "counts (search.json's bytes would not be the written ones). Leave `dtype:` out of the base, or "
                f"convert the source to {base.dtype} first"
            )
    g = base.weight_group
    units: dict[str, Unit] = {}
    scale_bytes = None
    for name, m in match_named_modules(model, base.targets, base.ignore):
        if not isinstance(m, torch.nn.Linear):
            continue
        w = tensors.get(f"{name}.weight")
        if w is None:
            raise UsageError(f"{model_dir}: no tensor {name}.weight in its safetensors; is it a quantized checkpoint?")
        scale_bytes = w.nbytes // (m.out_features * m.in_features)
        grp, fixed = g, False
        if g is not None and m.in_features % g:
            if base.indivisible is Indivisible.smaller_group and (g2 := divisor_group(m.in_features, g)):
                grp = g2
            else:
                fixed = True
        lin = Linear(name, m.out_features, m.in_features, w.nbytes, grp, fixed)
        key = name if unit == "layer" else name.rpartition(".")[0]
        units.setdefault(key, Unit(key, [])).linears.append(lin)
    if not units:
        raise UsageError(f"the base recipe's targets {base.targets} match no Linear layer of this model")
    for u in units.values():
        u.bytes = {o: sum(linear_bytes(lin, o, scale_bytes or 2) for lin in u.linears) for o in options}
    fixed = total - sum(lin.source_bytes for u in units.values() for lin in u.linears)
    return Layout(list(units.values()), fixed, params)
