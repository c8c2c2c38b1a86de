"""Which dtype to calibrate in (the recipe's, or a default that depends on the recipe and the checkpoint only; a
CPU probe may suggest another, never choose it), and casting a float32-calibrated checkpoint back to the source
dtype."""

from __future__ import annotations

import math
from importlib import metadata
from pathlib import Path

from quantize import cache
from quantize.checkpoint.files import read_config, safetensors_files, write_config
from quantize.checkpoint.loader import device
from quantize.convert.backends import calibration_default
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


# below this, the probe suggests float32 for a bf16 checkpoint on a CPU (a timing on a shared machine)
BF16_FAST = 1.5


def machine_bf16_speedup() -> tuple[float, bool]:
    """`bf16_speedup` measured once per boot of this machine and kept in the cache (`lookup_probe`), so the
    suggestion it makes does not change with what runs beside it (a timing taken while another job shared the
    cores measured 1.34 where the idle machine measures 2.3). Returns the speed-up and whether it was measured
    just now."""
    if (found := lookup_probe("bf16-speedup")) is not None:
        return found, False
    speedup = bf16_speedup()
    store_probe("bf16-speedup", speedup)
    return speedup, True


def _probe_path(name: str) -> Path | None:
    """$QUANTIZE_CACHE/probe/NAME-KEY.json, KEY = sha256(boot id, torch version) (quantize/cache.py `memo_path`):
    measured once per boot, so every conversion on the machine is suggested alike whatever else runs beside it."""
    return cache.memo_path("probe", f"{name}-", {"torch": metadata.version("torch")})


def lookup_probe(name: str) -> float | None:
    """A machine measurement taken earlier since this boot, else None (a kept value that is not a speed-up too)."""
    value = cache.read_memo(_probe_path(name), "value")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


def store_probe(name: str, value: float) -> None:
    cache.write_memo(_probe_path(name), {"value": value})


def calibration_dtype(recipe: Recipe, model_dir: Path) -> tuple[str, str]:
    """The dtype to calibrate in ("auto": the checkpoint's own) and why: the recipe's `dtype:`, else a default
    that depends on the recipe and the checkpoint only, never on the machine, so one recipe writes the same bytes
    on every host (docs/recipes.md, "The calibration dtype"):
    - the backend's own default for the method, where it has one (its `calibration_dtypes`: AWQ through
      llm-compressor in float32, as its grid search over bf16 activations has produced non-finite losses;
      GPTQModel's AWQ in the checkpoint's own half dtype, else bfloat16, as its AwqTorchLinear packs only from those);
    - otherwise the checkpoint's own dtype.
    A float32 calibration of a bf16 checkpoint has its float tensors cast back to bf16 after the integers are
    chosen (`cast_saved_floats`). On a CPU the bf16 probe may add a suggestion to the reason (`suggestion`); it
    never changes the dtype."""
    if recipe.dtype:
        return recipe.dtype, "the recipe's dtype"
    src = source_dtype(model_dir)
    if (default := calibration_default(recipe, src)) is not None:
        return default
    reason = f"the checkpoint's own dtype ({src}); the default, the same on every machine"
    hint = suggestion(src)
    return "auto", f"{reason}; {hint}" if hint else reason


def suggestion(src: str) -> str | None:
    """What the bf16 probe suggests for a bf16 checkpoint calibrated on a CPU whose bf16 matmuls are slow (below
    BF16_FAST× float32): setting `dtype: float32` in the recipe, which is faster there and writes other bytes.
    None elsewhere (an accelerator, another dtype, a CPU fast in bf16)."""
    if src != "bfloat16" or device() != "cpu":
        return None
    speedup, now = machine_bf16_speedup()
    if speedup >= BF16_FAST:
        return None
    when = "measured" if now else "measured earlier since this machine booted"
    return (
        f"bf16 matmuls run {speedup:.2f}x the speed of float32 on this CPU ({when}): `dtype: float32` in the recipe "
        "would calibrate faster here (and write other bytes than the default)"
    )


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
