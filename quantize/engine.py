"""The engine: compile a recipe to llm-compressor modifiers, run `oneshot`, check, save.

    plan_layers       which Linear layers get which group size (indivisible policy), from a meta-device model
    compile_modifiers recipe + plan -> llm-compressor modifiers (data: METHOD_MODIFIERS)
    convert           load, calibrate, quantize, check finite, save atomically, account, record provenance
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from quantize import accounting
from quantize.calibration import CalibrationSet, build_calibration, source_path
from quantize.errors import RuntimeFailure, UsageError
from quantize.io import atomic_dir, write_json
from quantize.models import load_model, recorded_weights_sha256, resolve_model, weights_sha256
from quantize.provenance import Phases, library_versions, memory_record
from quantize.recipe import MIN_GROUP, WEIGHT_ONLY_INT, Indivisible, Method, Recipe, Scheme, resolved_dict

SCHEMA_VERSION = 1
# Presets of compressed-tensors used as-is (activation settings included).
PRESET = {Scheme.W8A8: "W8A8", Scheme.FP8: "FP8", Scheme.FP8_DYNAMIC: "FP8_DYNAMIC"}


# --- which layer gets which group -------------------------------------------------------------

@dataclass
class LayerPlan:
    """Target Linear layers by weight group size (None: per channel / per tensor), and layers kept at 16 bits."""

    groups: dict[int | None, list[str]] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def quantized(self) -> int:
        return sum(len(v) for v in self.groups.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantized_layers": self.quantized,
            "by_group_size": {("per-channel" if g is None else str(g)): len(v) for g, v in self.groups.items()},
            "adjusted": {n: g for g, names in self.groups.items() for n in names if g is not None} if len(self.groups) > 1 else {},
            "kept_16bit": self.kept,
        }


def divisor_group(in_features: int, group_size: int) -> int | None:
    """The largest power-of-two group <= group_size (and >= MIN_GROUP) that divides in_features."""
    g = group_size
    while g >= MIN_GROUP:
        if in_features % g == 0:
            return g
        g //= 2
    return None


def meta_model(model_dir: Path, trust_remote_code: bool) -> Any:
    """The model's module tree on the meta device: shapes and names, no weights, no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{model_dir}/config.json does not describe a causal LM that transformers knows: {e}") from None


def plan_layers(model: Any, recipe: Recipe) -> LayerPlan:
    import torch
    from compressed_tensors.utils.match import match_named_modules

    plan = LayerPlan()
    layers = [(n, m) for n, m in match_named_modules(model, recipe.targets, recipe.ignore) if isinstance(m, torch.nn.Linear)]
    if not layers:
        raise UsageError(
            f"targets {recipe.targets} minus ignore {recipe.ignore} match no Linear layer of this model; "
            "check the names (use 'Linear' for all linear layers, or 're:<regex>' on module names)"
        )
    g = recipe.group_size if recipe.scheme in WEIGHT_ONLY_INT else None
    bad = []
    for name, module in layers:
        if g is None or module.in_features % g == 0:
            plan.groups.setdefault(g, []).append(name)
            continue
        if recipe.indivisible is Indivisible.error:
            bad.append(f"{name} (in_features {module.in_features})")
        elif recipe.indivisible is Indivisible.smaller_group and (g2 := divisor_group(module.in_features, g)):
            plan.groups.setdefault(g2, []).append(name)
        else:
            plan.kept[name] = f"in_features {module.in_features} is not divisible by group_size {g}"
    if bad:
        raise UsageError(
            f"group_size {g} does not divide the input features of {len(bad)} layer(s), e.g. {bad[0]}; "
            "set `indivisible: smaller-group` (largest group that divides) or `indivisible: keep` (16 bits)"
        )
    if not plan.groups:
        raise UsageError("no layer is left to quantize after the indivisible policy; lower group_size or use indivisible: smaller-group")
    return plan


# --- recipe -> modifiers ----------------------------------------------------------------------

def _scheme(recipe: Recipe, g: int | None, targets: list[str]) -> Any:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme, preset_name_to_scheme

    s = recipe.scheme
    if s in PRESET:
        scheme = preset_name_to_scheme(PRESET[s], targets)
        if s is Scheme.W8A8:
            scheme.weights.symmetric = recipe.symmetric
        return scheme
    weights = QuantizationArgs(
        num_bits=WEIGHT_ONLY_INT[s], type="int", symmetric=recipe.symmetric,
        strategy="group" if g else "channel", group_size=g,
    )
    return QuantizationScheme(targets=targets, weights=weights)


def compile_modifiers(recipe: Recipe, plan: LayerPlan) -> list[Any] | str:
    """The llm-compressor recipe for this recipe: modifier objects, or YAML for a verbatim recipe."""
    if recipe.method is Method.llmcompressor:
        return yaml.safe_dump(recipe.stages, sort_keys=False)
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import AWQModifier, SmoothQuantModifier

    groups = {f"group_{i}": _scheme(recipe, g, names) for i, (g, names) in enumerate(sorted(plan.groups.items(), key=lambda kv: -(kv[0] or 0)))}
    ignore = list(recipe.ignore) + sorted(plan.kept)
    quant = dict(config_groups=groups, ignore=ignore)
    # act_order: columns in order of decreasing diag(H) with static groups ("weight"): no g_idx is stored,
    # so the checkpoint keeps the plain layout every W4A16 kernel reads.
    gptq = lambda: GPTQModifier(**quant, dampening_frac=recipe.dampening_frac,  # noqa: E731
                                actorder="weight" if recipe.act_order else None)
    # Method -> modifier chain: transforms first, then the modifier that sets scales and rounds.
    chains = {
        Method.rtn: lambda: [QuantizationModifier(**quant)],
        Method.fp8: lambda: [QuantizationModifier(**quant)],
        Method.gptq: lambda: [gptq()],
        Method.awq: lambda: [AWQModifier(duo_scaling=True, n_grid=recipe.awq_grid), QuantizationModifier(**quant)],
        Method.smoothquant: lambda: [SmoothQuantModifier(smoothing_strength=recipe.smoothing_strength), gptq()],
    }
    return chains[recipe.method]()


# --- CPU-only torch ---------------------------------------------------------------------------

@contextmanager
def cpu_safe_calibration() -> Iterator[None]:
    """llm-compressor pins cached activations for faster host-to-device copies (AWQ's grid search).
    On a torch without an accelerator, Tensor.pin_memory() raises; there is no device to copy to,
    so pinning is skipped for the duration of the run (no file on disk is changed)."""
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        yield
        return
    original = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original


@contextmanager
def quiet_libraries(quiet: bool) -> Iterator[None]:
    if not quiet:
        yield
        return
    from loguru import logger

    logger.disable("llmcompressor")
    logger.disable("compressed_tensors")
    old = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        logger.enable("llmcompressor")
        logger.enable("compressed_tensors")
        if old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = old


# --- checks -----------------------------------------------------------------------------------

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
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def check_finite(model: Any, input_ids: Any, stage: str) -> dict[str, Any]:
    """Logits on a few calibration rows must be finite; otherwise name the first bad layer."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids).logits  # (B, T, V)
    ok = bool(torch.isfinite(logits).all())
    if not ok:
        layer = first_nonfinite_module(model, input_ids)
        raise RuntimeFailure(
            f"{stage}: the model's logits are not finite (NaN or inf); the first layer whose output is not "
            f"finite is {layer}. Nothing was saved. Try more calibration samples, a smaller group_size, "
            f"`ignore:` for that layer, or float32 (`dtype: float32`)"
        )
    return {"stage": stage, "rows": int(input_ids.shape[0]), "tokens": int(input_ids.numel()), "finite": ok,
            "max_abs_logit": float(logits.abs().max())}


# --- the whole run ----------------------------------------------------------------------------

def output_dir(recipe: Recipe, override: str | None) -> Path:
    return Path(override or recipe.output or f"outputs/{recipe.name}")


def preflight(recipe: Recipe, out: Path, force: bool) -> Path:
    """Everything that can be checked before a model is loaded."""
    model_dir = resolve_model(recipe.model)
    if recipe.needs_calibration and recipe.calibration is not None:
        source_path(recipe.calibration.source)
    if out.exists() and not force:
        raise UsageError(f"output {out} already exists; choose another `output:` (or --output), or pass --force to replace it")
    if out.exists() and not (out / "quantize.json").is_file():
        raise UsageError(f"output {out} exists and is not a quantize checkpoint; refusing to replace it even with --force")
    return model_dir


def convert(recipe: Recipe, recipe_sha256: str, recipe_path: str, out: Path, force: bool = False,
            quiet: bool = False) -> dict[str, Any]:
    import torch

    phases = Phases()
    started = dt.datetime.now(dt.timezone.utc)
    model_dir = preflight(recipe, out, force)
    with phases("plan"):
        plan = plan_layers(meta_model(model_dir, recipe.trust_remote_code), recipe) if recipe.method is not Method.llmcompressor else LayerPlan()
        modifiers = compile_modifiers(recipe, plan)
    with phases("load"):
        work_dtype = calibration_dtype(recipe)
        model, tok = load_model(model_dir, recipe.trust_remote_code, dtype=None if work_dtype == "auto" else getattr(torch, work_dtype))
        save_dtype = source_dtype(model_dir)
        source_hash = recorded_weights_sha256(model_dir)
        source_params = accounting.parameter_count(model_dir)
    calib: CalibrationSet | None = None
    if recipe.needs_calibration:
        with phases("tokenize"):
            calib = build_calibration(tok, recipe.calibration)
    seed = recipe.calibration.seed if recipe.calibration else 0
    torch.manual_seed(seed)
    with phases("quantize"), quiet_libraries(quiet), cpu_safe_calibration():
        from datasets import Dataset
        from llmcompressor import oneshot

        kwargs: dict[str, Any] = {}
        if calib is not None:
            ids = calib.input_ids.tolist()
            kwargs = dict(
                dataset=Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * calib.seq_len] * calib.samples}),
                num_calibration_samples=calib.samples, max_seq_length=calib.seq_len, shuffle_calibration_samples=False,
            )
        try:
            model = oneshot(model=model, processor=tok, recipe=modifiers, **kwargs) or model
        except (ValueError, KeyError) as e:
            if recipe.method is Method.llmcompressor:
                raise UsageError(f"llm-compressor rejected the verbatim `stages:` recipe: {e}") from None
            raise RuntimeFailure(f"llm-compressor failed: {type(e).__name__}: {e}") from e
    probe = (calib.input_ids[:4, :128] if calib is not None
             else torch.tensor([tok("The quick brown fox jumps over the lazy dog.")["input_ids"]]))
    with phases("check"):
        finite = [check_finite(model, probe, "after quantization")]
    with atomic_dir(out if not force else out.with_name(out.name + ".new")) as tmp:
        with phases("save"):
            model.save_pretrained(tmp, save_compressed=True)
            tok.save_pretrained(tmp)
            if work_dtype != "auto" and save_dtype != work_dtype:
                cast_saved_floats(tmp, save_dtype)
        with phases("reload-check"):
            finite.append(reload_check(tmp, probe, recipe.trust_remote_code))
        with phases("account"):
            report = accounting.bits_report(tmp)
            out_hash = weights_sha256(tmp)
        meta = _metadata(recipe, recipe_sha256, recipe_path, model_dir, source_hash, source_params, calib, plan,
                         modifiers, report, out_hash, finite, phases, started, seed)
        meta["engine"].update(calibration_dtype=work_dtype, saved_dtype=save_dtype)
        write_json(tmp / "quantize.json", meta)
        (tmp / "README.md").write_text(model_card(meta))
    if force:
        _swap(out.with_name(out.name + ".new"), out)
    return meta


def calibration_dtype(recipe: Recipe) -> str:
    """float32 on a CPU (bf16 matmuls run about 6x slower there, and fp32 keeps AWQ's grid search finite);
    the checkpoint's own dtype on an accelerator, unless the recipe says."""
    import torch

    if recipe.dtype:
        return recipe.dtype
    return "auto" if torch.accelerator.is_available() else "float32"


def source_dtype(model_dir: Path) -> str:
    cfg = json.loads((model_dir / "config.json").read_text())
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


# Float tensors that stay float32 whatever the model's dtype (compressed-tensors' global scales).
KEEP_FP32 = (".weight_global_scale", ".input_global_scale")


def cast_saved_floats(folder: Path, dtype: str) -> None:
    """Cast the float32 tensors of a checkpoint calibrated in float32 to the source model's dtype.

    The packed integers were computed from float32 weights and scales, so they are exact; the cast
    rounds scales, norms and embeddings to the dtype the source model had, as a bf16 run would."""
    import torch
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype)
    for f in accounting.safetensors_files(folder):
        tensors = load_file(str(f))
        cast = {k: (v.to(target) if v.dtype == torch.float32 and not k.endswith(KEEP_FP32) else v) for k, v in tensors.items()}
        save_file(cast, str(f), metadata={"format": "pt"})
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = dtype
    cfg.pop("torch_dtype", None)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def _swap(new: Path, out: Path) -> None:
    import shutil

    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def reload_check(path: Path, probe: Any, trust_remote_code: bool) -> dict[str, Any]:
    """Reload the saved checkpoint with plain transformers and check its logits are finite."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    model.eval()
    return check_finite(model, probe, "after reloading the saved checkpoint with transformers")


def _metadata(recipe: Recipe, recipe_sha256: str, recipe_path: str, model_dir: Path, source_hash: str,
              source_params: int | None, calib: CalibrationSet | None, plan: LayerPlan, modifiers: Any,
              report: accounting.BitsReport, out_hash: str, finite: list[dict], phases: Phases,
              started: dt.datetime, seed: int) -> dict[str, Any]:
    resolved = resolved_dict(recipe)
    params = source_params or report.parameters
    return {
        "schema_version": SCHEMA_VERSION,
        "created": started.isoformat(timespec="seconds"),
        "recipe": {
            "path": recipe_path,
            "sha256": recipe_sha256,
            "resolved": resolved,
            "resolved_sha256": _sha256_json(resolved),
        },
        "method": recipe.method.value,
        "scheme": recipe.scheme.value if recipe.scheme else None,
        "source_model": {
            "path": str(model_dir),
            "weights_sha256": source_hash,
            "parameters": source_params,
        },
        "weights_sha256": out_hash,
        "calibration": calib.provenance() if calib else None,
        "seed": seed,
        "layer_plan": plan.to_dict(),
        "engine": {
            "backend": recipe.backend.value,
            "modifiers": modifiers if isinstance(modifiers, str) else [repr(m) for m in modifiers],
        },
        "versions": library_versions(),
        "time_seconds": dict(phases.seconds, total=phases.total()),
        "memory": memory_record(),
        "finite_checks": finite,
        "bits": {
            "total_bytes": report.total_bytes,
            "source_parameters": params,
            "bits_per_weight": 8 * report.total_bytes / params if params else None,
            "quantized_linear_bits_per_weight": report.quantized_linear_bits_per_weight,
            "quantized_linear_parameters": report.quantized_linear_parameters,
            "bytes_by_role": report.bytes_by_role,
            "format": report.format,
            "modules": report.to_dict()["modules"],
            "notes": report.notes,
        },
    }


def _sha256_json(data: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def model_card(meta: dict[str, Any]) -> str:
    b = meta["bits"]
    cal = meta["calibration"]
    qbits = b["quantized_linear_bits_per_weight"]
    lines = [
        f"# {meta['recipe']['resolved']['name']}",
        "",
        f"Quantized with [quantize](https://pypi.org/project/quantize/) {meta['versions']['quantize']} "
        f"(llm-compressor {meta['versions']['llmcompressor']}, compressed-tensors format).",
        "",
        "| | |",
        "|---|---|",
        f"| method | {meta['method']} |",
        f"| scheme | {meta['scheme'] or 'from verbatim llm-compressor recipe'} |",
        f"| true bits per weight (whole model, every stored byte) | {b['bits_per_weight']:.3f} |",
        f"| bits per weight, quantized linear layers | {qbits:.3f} |" if qbits else "| bits per weight, quantized linear layers | none quantized |",
        f"| total tensor bytes | {b['total_bytes']:,} |",
        f"| source parameters | {b['source_parameters']:,} |",
        f"| source model weights sha256 | `{meta['source_model']['weights_sha256']}` |",
        f"| recipe sha256 | `{meta['recipe']['sha256']}` |",
        f"| calibration | {cal['samples']} × {cal['seq_len']} tokens of {cal['description']}, seed {cal['seed']} |" if cal else "| calibration | none (data-free) |",
        f"| layers kept at 16 bits | {len(meta['layer_plan']['kept_16bit'])} |",
        f"| wall time | {meta['time_seconds']['total']:.0f} s |",
        "",
        "Bytes by role: " + ", ".join(f"{k} {v:,}" for k, v in b["bytes_by_role"].items()),
        "",
        "Full provenance is in `quantize.json`. Load with `transformers.AutoModelForCausalLM.from_pretrained` "
        "(compressed-tensors installed) or serve with vLLM.",
        "",
    ]
    return "\n".join(lines)
