"""Which dtype to calibrate in (chosen from what the machine does well), and casting a float32-calibrated
checkpoint back to the source dtype."""

from __future__ import annotations

from pathlib import Path

from quantize.checkpoint.files import read_config, safetensors_files, write_config
from quantize.checkpoint.loader import device
from quantize.convert.recipe import Recipe

# Float tensors that stay float32 whatever the model's dtype (compressed-tensors' global scales).
KEEP_FP32 = (".weight_global_scale", ".input_global_scale")


def bf16_speedup(tokens: int = 512, d_in: int = 576, d_out: int = 1536, repeats: int = 5) -> float:
    """How much faster this CPU multiplies in bfloat16 than in float32: t_fp32 / t_bf16, each the best of three
    runs of `repeats` products X W^T with X (tokens, d_in) and W (d_out, d_in) (a 135M model's MLP shape;
    about 50 ms). Above 1 on CPUs with AVX512-BF16 or AMX (measured 6.3 on a 2-core Xeon with AMX), below on
    CPUs without (about 1/6 where the float32 default was chosen)."""
    import time

    import torch

    def best(dtype: torch.dtype) -> float:
        x, w = torch.randn(tokens, d_in, dtype=dtype), torch.randn(d_out, d_in, dtype=dtype)
        torch.nn.functional.linear(x, w)  # warm-up: kernel selection
        times = []
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(repeats):
                torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - t)
        return min(times)

    return best(torch.float32) / best(torch.bfloat16)


# bf16 is chosen on a CPU only when it is clearly faster: the probe is a timing on a shared machine
BF16_FAST = 1.5


def machine_bf16_speedup() -> tuple[float, bool]:
    """`bf16_speedup` measured once per boot of this machine and kept in the cache (cache.py `probes`), so every
    conversion here calibrates in the same dtype whatever runs beside it: a timing taken while another job shared
    the cores measured 1.34 where the idle machine measures 2.3, and flipped a conversion to float32 (other
    weights from the same recipe). Returns the speed-up and whether it was measured just now."""
    from quantize import cache

    if (found := cache.lookup_probe("bf16-speedup")) is not None:
        return found, False
    speedup = bf16_speedup()
    cache.store_probe("bf16-speedup", speedup)
    return speedup, True


def calibration_dtype(recipe: Recipe, model_dir: Path) -> tuple[str, str]:
    """The dtype to calibrate in ("auto": the checkpoint's own) and why.

    The recipe's `dtype` wins. On an accelerator: the checkpoint's own dtype. On a CPU, for a bf16 checkpoint:
    its own dtype where bf16 matmuls run at least BF16_FAST× faster than float32 (`bf16_speedup`, measured by
    the first run after the machine boots and kept: `machine_bf16_speedup`), as plain llm-compressor would
    calibrate; float32 elsewhere (the float scales are then cast back to bf16 after the integers are chosen).
    AWQ calibrates in float32 on a CPU whatever the probe says: its grid search over bf16 activations has
    produced non-finite losses. GPTQModel's AWQ packs only from float16 or bfloat16 weights (its AwqTorchLinear
    refuses float32): the checkpoint's own half dtype, else bfloat16."""
    from quantize.convert.recipe import Backend, Method

    if recipe.dtype:
        return recipe.dtype, "the recipe's dtype"
    src = source_dtype(model_dir)
    if recipe.backend is Backend.gptqmodel and recipe.method is Method.awq:
        half = src in ("float16", "bfloat16")
        return ("auto" if half else "bfloat16"), "GPTQModel's AWQ packs from float16/bfloat16 weights only"
    if device() != "cpu":
        return "auto", "the checkpoint's dtype on an accelerator"
    if src == "float32":
        return "auto", "the checkpoint is float32"
    if recipe.method is Method.awq:
        return "float32", "AWQ on a CPU (its grid search keeps finite losses in float32)"
    if src != "bfloat16":
        return "float32", f"a {src} checkpoint on a CPU (no fast {src} kernels assumed)"
    speedup, now = machine_bf16_speedup()
    when = "measured" if now else "measured earlier since this machine booted"
    if speedup >= BF16_FAST:
        return "auto", f"bf16 matmuls {speedup:.1f}x faster than float32 on this CPU ({when})"
    return "float32", f"bf16 matmuls {speedup:.2f}x the speed of float32 on this CPU ({when}; < {BF16_FAST})"


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
