"""Checks on a quantized model: finite logits, and the first layer whose output is not finite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantize.checkpoint import qdq
from quantize.checkpoint.loader import load_model
from quantize.errors import RuntimeFailure
from quantize.records import FiniteCheck


def first_nonfinite_module(model: Any, input_ids: Any) -> str | None:
    """Run the model once with hooks; name the first module (in execution order) whose output is not finite."""
    import torch

    found: list[str] = []

    def hook(name: str):
        def fn(_module: Any, _inputs: Any, output: Any) -> None:
            t = output[0] if isinstance(output, tuple) else output
            if not found and isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all():
                found.append(name)

        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad(), qdq.installed():
            model(input_ids=input_ids)
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def check_finite(model: Any, input_ids: Any, stage: str) -> FiniteCheck:
    """Logits on a few calibration rows must be finite; otherwise name the first bad layer."""
    import torch

    with torch.no_grad(), qdq.installed():
        logits = model(input_ids=input_ids).logits  # (B, T, V)
    ok = bool(torch.isfinite(logits).all())
    if not ok:
        layer = first_nonfinite_module(model, input_ids)
        raise RuntimeFailure(
            f"{stage}: the model's logits are not finite (NaN or inf); the first layer whose output is not "
            f"finite is {layer}. Nothing was saved. Try more calibration samples, a smaller group_size, "
            f"`ignore:` for that layer, or float32 (`dtype: float32`)"
        )
    return FiniteCheck(
        stage=stage,
        rows=int(input_ids.shape[0]),
        tokens=int(input_ids.numel()),
        finite=ok,
        max_abs_logit=float(logits.abs().max()),
    )


def reload_check(path: Path, probe: Any, trust_remote_code: bool) -> FiniteCheck:
    """Reload the saved checkpoint with plain transformers (safetensors only) and check its logits are finite."""
    model, _ = load_model(path, trust_remote_code)
    return check_finite(model, probe, "after reloading the saved checkpoint with transformers")
