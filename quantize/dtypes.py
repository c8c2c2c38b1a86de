"""Which dtype to calibrate in, and casting a float32-calibrated checkpoint back to the source dtype."""

from __future__ import annotations

from pathlib import Path

from quantize.checkpoint import read_config, safetensors_files, write_config
from quantize.models import device
from quantize.recipe import Recipe

# Float tensors that stay float32 whatever the model's dtype (compressed-tensors' global scales).
KEEP_FP32 = (".weight_global_scale", ".input_global_scale")


def calibration_dtype(recipe: Recipe) -> str:
    """float32 on a CPU (bf16 matmuls ran about 6x slower on the CPU this was measured on, and fp32
    keeps AWQ's grid search finite); the checkpoint's own dtype ("auto") on an accelerator, unless
    the recipe says."""
    if recipe.dtype:
        return recipe.dtype
    return "auto" if device() != "cpu" else "float32"


def source_dtype(model_dir: Path) -> str:
    cfg = read_config(model_dir)
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def cast_saved_floats(folder: Path, dtype: str) -> None:
    """Cast the float32 tensors of a checkpoint calibrated in float32 to the source model's dtype.

    The packed integers were computed from float32 weights and scales, so they are exact; the cast
    rounds scales, norms and embeddings to the dtype the source model had, as a bf16 run would."""
    import torch
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype)
    for f in safetensors_files(folder):
        tensors = load_file(str(f))
        cast = {
            k: (v.to(target) if v.dtype == torch.float32 and not k.endswith(KEEP_FP32) else v)
            for k, v in tensors.items()
        }
        save_file(cast, str(f), metadata={"format": "pt"})
    cfg = read_config(folder)
    cfg["dtype"] = dtype
    cfg.pop("torch_dtype", None)
    write_config(folder, cfg)
