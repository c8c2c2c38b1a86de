"""Which dtype to calibrate in (the recipe's, or a default that depends on the recipe and the checkpoint only; a
CPU probe may suggest another, never choose it), and casting a float32-calibrated checkpoint back to the source
dtype."""

from __future__ import annotations

import math
from importlib import metadata
from pathlib import Path

from quantize import cache
from quantize.checkpoint.files import SAFE_INDEX, read_config, read_json_object, safetensors_files, write_config
from quantize.checkpoint.headers import FLOATS, TORCH_NAMES, all_tensors, read_header
from quantize.checkpoint.loader import device, meta_model
from quantize.compat.transformers import loaded_dtypes, saved_names
from quantize.convert.backends import calibration_default
from quantize.convert.recipe import Recipe
from quantize.errors import UsageError

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
    """The dtype transformers' `from_pretrained(dtype="auto")` builds the model in, and so the dtype the in-memory
    path loads, quantizes and saves every floating tensor in (but the modules the model class keeps in float32,
    its `_keep_in_fp32_modules_strict`): config.json's `dtype` (or the older `torch_dtype`), else the shard index's
    metadata `dtype`, else the dtype of the first floating tensor (float8 and float4 passed over) of the first
    weight file, names in sorted order, else float32 (modeling_utils._get_dtype and get_state_dict_dtype in
    transformers 5.17; tests/convert/test_dtypes.py holds them to a load). Read from config.json and the headers."""
    cfg = read_config(model_dir)
    if named := cfg.get("dtype") or cfg.get("torch_dtype"):
        return str(named)
    files = sorted(safetensors_files(model_dir), key=lambda f: f.name)
    index = model_dir / SAFE_INDEX
    if model_dir.is_dir() and index.is_file():
        metadata = read_json_object(index, "fix or remove the shard index").get("metadata")
        if isinstance(metadata, dict) and metadata.get("dtype") in FLOATS.values():
            return str(metadata["dtype"])
    found, _, _ = read_header(files[0])
    return next((FLOATS[found[n].dtype] for n in sorted(found) if found[n].dtype in FLOATS), "float32")


def stored_dtypes(model_dir: Path) -> dict[str, list[str]]:
    """The checkpoint's floating tensors (16 bits and up) by the dtype they are stored in, read from its headers:
    {"bfloat16": [names, sorted], ...}."""
    found, _ = all_tensors(safetensors_files(model_dir))
    by: dict[str, list[str]] = {}
    for name in sorted(found):
        if (dtype := FLOATS.get(found[name].dtype)) is not None:
            by.setdefault(dtype, []).append(name)
    return by


def check_narrowing(model_dir: Path, recipe_dtype: str | None) -> None:
    """Refuse, before anything loads, a run that would cast a stored bfloat16 or float32 tensor to float16, where a
    value beyond ±65504 becomes inf with no error: a model whose own dtype (`source_dtype`: config.json's, else the
    first tensor's) is float16 while some tensor is stored wider (transformers casts it on load, the in-memory path
    saves it so, and the output's config.json says float16 on both paths), or a recipe's `dtype: float16` for such a
    checkpoint. Decided from config.json and the headers only, never by reading values: a checkpoint whose values
    would fit is refused too, and its fix is as cheap (say the dtype it is stored in)."""
    src = source_dtype(model_dir)
    if "float16" not in (src, recipe_dtype):
        return
    every = stored_dtypes(model_dir)
    wider = {d: names for d, names in every.items() if d in ("bfloat16", "float32", "float64")}
    if not wider:
        return
    dtype, names = max(wider.items(), key=lambda kv: len(kv[1]))
    count, total = sum(len(n) for n in wider.values()), sum(len(n) for n in every.values())
    stored = f"{count} of its {total} floating tensors are stored in {' and '.join(sorted(wider))} (e.g. {names[0]})"
    if recipe_dtype == "float16" and src != "float16":
        raise UsageError(
            f"dtype: float16 in the recipe, and model {model_dir} is {src}: {stored}. Loading casts them to float16, "
            "where a value beyond ±65504 becomes inf with no error. Remove `dtype:` from the recipe (the checkpoint's "
            f"own {src}), or set it to bfloat16 or float32"
        )
    cfg = read_config(model_dir)
    said = "config.json's `dtype`" if cfg.get("dtype") or cfg.get("torch_dtype") else "its first floating tensor"
    raise UsageError(
        f'model {model_dir}: its dtype is float16 ({said}, as transformers\' from_pretrained(dtype="auto") picks it), '
        f"but {stored}. Loading casts them to float16, where a value beyond ±65504 becomes inf with no error, and "
        f'the output would say float16 on either path. Set config.json\'s "dtype" to the dtype the weights are '
        f"stored in ({dtype}), or store them in float16 yourself if their values fit"
    )


def written_dtype(folder: Path) -> str:
    """What a written checkpoint stores its floating tensors of 16 bits and up in, read from its headers (the
    record's `saved_dtype`): the dtype of most of them, then any other with its count and an example, as
    "bfloat16 (float32: 3 tensors, e.g. model.layers.1.mlp.gate.e_score_correction_bias)". Compressed-tensors'
    float32 global scales (KEEP_FP32), float32 in every FP4 checkpoint, are left out."""
    kept = {d: [n for n in names if not n.endswith(KEEP_FP32)] for d, names in stored_dtypes(folder).items()}
    by = {d: names for d, names in kept.items() if names}
    if not by:
        return "none"
    order = sorted(by, key=lambda d: (-len(by[d]), d))
    others = [f"{d}: {len(by[d])} tensor{'s' if len(by[d]) > 1 else ''}, e.g. {by[d][0]}" for d in order[1:]]
    return f"{order[0]} ({'; '.join(others)})" if others else order[0]


def held_dtypes(model_dir: Path, trust_remote_code: bool, dtype: str) -> dict[str, str]:
    """The dtype the in-memory path holds and saves each of the source's tensors in when it loads the model in
    `dtype` (its source_dtype, `from_pretrained(dtype="auto")`): `dtype`, but the modules the model class keeps in
    float32 (compat.transformers.loaded_dtypes: its `_keep_in_fp32_modules_strict`, DeepSeek-V3's
    e_score_correction_bias), keyed by the names save_pretrained writes (compat.transformers.saved_names). A stored
    tensor the model does not hold (a multi-token-prediction module a save copies from the source) keeps the dtype
    it is stored in. Read from config.json and the headers on a meta-device model: nothing is allocated."""
    import torch

    stored, _ = all_tensors(safetensors_files(model_dir))
    model = meta_model(model_dir, trust_remote_code)
    held = loaded_dtypes(
        model,
        {n: (t.shape, getattr(torch, TORCH_NAMES.get(t.dtype, "uint8"))) for n, t in stored.items()},
        getattr(torch, dtype),
    )
    named = saved_names(model, list(held))
    found = {n: TORCH_NAMES[t.dtype] for n, t in stored.items() if t.dtype in TORCH_NAMES}
    return found | {named[n]: str(t).removeprefix("torch.") for n, t in held.items() if t.is_floating_point}


def cast_saved_floats(folder: Path, dtype: str, held: dict[str, str] | None = None) -> list[str]:
    """Cast the floating tensors (16 bits and up) of a written checkpoint to the dtype the in-memory path saves
    them in: `held`'s for the tensors it names (held_dtypes: the source dtype, but the modules the model keeps in
    float32 and the tensors it does not load), `dtype` (the source's) for the others, which the quantization made
    (its scales); compressed-tensors' float32 global scales (KEEP_FP32) are left as they are. Files with nothing
    to cast are not rewritten, and one file is in memory at a time. Returns the names cast.

    After a float32 calibration: the packed integers were computed from float32 weights and scales, so they are
    exact; the cast rounds scales, norms and embeddings to the dtype the source model had, as a bf16 run would,
    and keeps in float32 what a bf16 run keeps in float32 (before 2026-12-07 every float32 tensor was cast, those
    too). After a streamed conversion, whose stored tensors the backend cast to `held`'s dtypes before quantizing
    them (its `stream`), only what the quantization made in another dtype is left to cast (nothing, measured on the
    tests' tiny Llama: its scales come out in their weight's dtype)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    held = held or {}
    cast = []
    for f in safetensors_files(folder):
        with safe_open(str(f), framework="pt") as st:
            dtypes = {k: st.get_slice(k).get_dtype() for k in st.keys()}  # noqa: SIM118
        todo = {
            k: target
            for k, d in dtypes.items()
            if d in FLOATS and not k.endswith(KEEP_FP32) and (target := held.get(k, dtype)) != FLOATS[d]
        }
        if not todo:
            continue
        tensors = load_file(str(f))
        for k, target in todo.items():
            tensors[k] = tensors[k].to(getattr(torch, target))
        save_file(tensors, str(f), metadata={"format": "pt"})
        cast += sorted(todo)
    cfg = read_config(folder)
    if cfg.get("dtype") != dtype or "torch_dtype" in cfg:
        cfg["dtype"] = dtype
        cfg.pop("torch_dtype", None)
        write_config(folder, cfg)
    return cast
