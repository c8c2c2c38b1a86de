"""Whether a checkpoint rounds what it computes, not only its weights: the rule that decides how our scorer batches
(quantize/evaluate/lm.py: such a model is scored one request a pass) and whether a score's key names the machine
that computed it (quantize/evaluate/cache.py `Runtime`: such numbers move with the CPU and thread count, docs/
results.md). Read from a transformers config or a loaded model's modules, or from a folder's config.json; nothing
here imports torch or loads a model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantize.checkpoint.files import read_config

WEIGHT_ONLY_METHODS = ("gptq", "awq")  # transformers' quantization methods that round the weights alone


def rounds_activations(config: Any, modules: Iterable[Any] = ()) -> bool:
    """Whether the model rounds what it computes, not only its weights. `config`'s `quantization_config`
    (transformers' object, as a loaded model holds it, or config.json's dict) rounds (`quantization_rounds`); or one
    of `modules` carries a compressed-tensors scheme (`quantization_scheme`, what its forward rounds by) with input
    or output activations: a format transformers dequantizes at load (NVFP4, MXFP4: checkpoint/loader.
    DEQUANTIZED_AT_LOAD) drops the config's quantization_config and keeps rounding each linear's input."""
    for m in modules:
        scheme = getattr(m, "quantization_scheme", None)
        if any(getattr(scheme, a, None) is not None for a in ("input_activations", "output_activations")):
            return True
    return quantization_rounds(getattr(config, "quantization_config", None))


def quantization_rounds(qc: Any) -> bool:
    """Whether a quantization config rounds more than weights: compressed-tensors' with a config group whose
    `input_activations` or `output_activations` is set (FP8 dynamic and static, FP8 block, W8A8, W4AFP8, NVFP4,
    MXFP4) or with a `kv_cache_scheme`, or of a method this rule cannot read (neither compressed-tensors nor one of
    WEIGHT_ONLY_METHODS). None (no quantization) rounds nothing."""
    if qc is None:
        return False
    if not isinstance(qc, dict):  # transformers' CompressedTensorsConfig (to_dict), a pydantic model (model_dump)
        qc = qc.to_dict() if hasattr(qc, "to_dict") else qc.model_dump() if hasattr(qc, "model_dump") else None
    if not isinstance(qc, dict):
        return True
    method = qc.get("quant_method")
    method = str(getattr(method, "value", method) or "").lower()  # transformers' QuantizationMethod is an enum
    if method != "compressed-tensors":
        return method not in WEIGHT_ONLY_METHODS
    groups = qc.get("config_groups") or {}
    if qc.get("kv_cache_scheme") is not None or not isinstance(groups, dict):
        return True
    return any(
        not isinstance(g, dict) or g.get("input_activations") is not None or g.get("output_activations") is not None
        for g in groups.values()
    )


def stored_rounds_activations(checkpoint: Path) -> bool:
    """Whether the checkpoint folder's config.json says its model rounds more than weights (`quantization_rounds`
    of its `quantization_config`); False for a folder with no config.json (nothing to load, nothing scored)."""
    return quantization_rounds(read_config(checkpoint, required=False).get("quantization_config"))
