"""Damage of quantizing one layer group alone: mean KL to the baseline on golden agreement items.

With the baseline loaded once (in the suite's scoring dtype: float32 on a CPU unless the suite says `dtype:`), each
unit's Linear weights W (out × in) are replaced in place by
their round-to-nearest fake quantization Q(W), the rounding `quantize run` applies with method rtn
(compressed-tensors' min-max scales: s = max|W_g| / (2^(b−1) − ½) per group g, Q(W) = s·clamp(round(W/s))),
the agreement items are scored, and W is restored. The damage is the mean KL lower bound against the
baseline's stored top-k (quantize/evaluate/agreement.py), the same measure the gate's agreement rules use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from quantize.compat.compressed_tensors import fake_quantize
from quantize.convert.recipe import WEIGHT_ONLY_INT, Scheme
from quantize.evaluate.agreement import compare
from quantize.search.units import Unit

if TYPE_CHECKING:
    from quantize.evaluate.agreement import BaselineTopK


def fake_quantize_weight(w: Any, bits: int, group: int | None) -> Any:
    """Q(W) for symmetric int weights with `group` weights per scale (None: one scale per output channel)."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams

    out, inp = w.shape
    g = group or inp
    args = QuantizationArgs(
        num_bits=bits, type="int", symmetric=True, strategy="group" if group else "channel", group_size=group
    )
    wg = w.float().reshape(out, inp // g, g)  # (out, in/g, g)
    scale, zp = calculate_qparams(wg.amin(-1), wg.amax(-1), args)  # (out, in/g)
    if not group:
        scale, zp = scale.reshape(out, 1), zp.reshape(out, 1)
    with torch.no_grad():
        return fake_quantize(w.float(), scale, zp, args).to(w.dtype)


@contextmanager
def quantized(model: Any, units: list[Unit], allocation: dict[str, str]) -> Iterator[None]:
    """Within the block, each unit's Linears carry Q(W) for the unit's option ("keep": unchanged)."""
    import torch

    modules = dict(model.named_modules())
    saved = {}
    try:
        for u in units:
            opt = allocation.get(u.name, "keep")
            if opt == "keep":
                continue
            for lin in u.linears:
                if lin.fixed:
                    continue
                m = modules[lin.name]
                saved[lin.name] = m.weight.data.clone()
                m.weight.data = fake_quantize_weight(m.weight.data, WEIGHT_ONLY_INT[Scheme(opt)], lin.group)
        yield
    finally:
        with torch.no_grad():
            for name, w in saved.items():
                modules[name].weight.data = w


def measure(
    scorer: Any, reqs: list[Any], base_topk: BaselineTopK, model: Any, units: list[Unit], alloc: dict[str, str]
) -> dict[str, float]:
    """Mean KL (lower bound) and top-1 agreement of the model with `alloc` applied."""
    with quantized(model, units, alloc):
        r = compare(scorer, reqs, base_topk)
    return {"kl": r["kl_mean"], "kl_se": r["kl_se"], "top1": r["top1"]}


def sensitivities(
    scorer: Any,
    reqs: list[Any],
    base_topk: BaselineTopK,
    model: Any,
    units: list[Unit],
    options: list[str],
    progress: bool = True,
) -> dict[str, dict[str, float]]:
    """unit -> option -> mean KL with that unit alone quantized (keep: 0)."""
    from tqdm import tqdm

    out: dict[str, dict[str, float]] = {}
    todo = [(u, o) for u in units for o in options if o != "keep"]
    bar = tqdm(todo, desc="sensitivity (layer group × option)", disable=not progress, unit="run")
    for u, o in bar:
        out.setdefault(u.name, {"keep": 0.0})[o] = measure(scorer, reqs, base_topk, model, [u], {u.name: o})["kl"]
    return out
