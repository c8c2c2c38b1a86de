"""The engine: a validated recipe in, a checked checkpoint with its quantize.json out.

preflight   everything that can be checked before a model is loaded
convert     plan (plan.py) -> modifiers (modifiers.py) -> load -> calibrate and quantize
            (llm-compressor `oneshot`, runtime.py) -> finite checks (checks.py) -> atomic save,
            dtype cast (dtypes.py), reload check, accounting -> quantize.json and model card
            `backend: gptqmodel`: GPTQModel loads, calibrates and writes its native GPTQ format in place of
            llm-compressor (`_gptqmodel`); the checks, accounting and records are the same
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from quantize import records
from quantize.checkpoint import accounting
from quantize.checkpoint.files import missing_packages, weights_sha256
from quantize.checkpoint.loader import DEFAULT_MODEL_HUB_ID, device, load_model, recorded_weights_sha256, resolve_model
from quantize.convert.calibration import CalibrationSet, build_calibration, source_path
from quantize.convert.card import model_card
from quantize.convert.checks import reload_check
from quantize.convert.dtypes import calibration_dtype, cast_saved_floats, source_dtype
from quantize.convert.modifiers import compile_modifiers
from quantize.convert.plan import LayerPlan, meta_model, plan_layers
from quantize.convert.provenance import Phases, library_versions, memory_record
from quantize.convert.recipe import BACKEND_PACKAGES, Backend, Method, Recipe, resolved_dict
from quantize.convert.runtime import cpu_safe_calibration
from quantize.errors import RuntimeFailure, UsageError
from quantize.io import atomic_dir, sha256_json
from quantize.quiet import quiet_libraries
from quantize.records import (
    BitsRecord,
    EngineRecord,
    MemoryRecord,
    RecipeRef,
    RunRecord,
    SourceModel,
)


def output_dir(recipe: Recipe, override: str | None) -> Path:
    return Path(override or recipe.output or f"outputs/{recipe.name}")


def preflight(recipe: Recipe, out: Path, force: bool) -> Path:
    """Everything that can be checked before torch is imported or a model is loaded: the backend's packages,
    the model folder, the calibration source, and the whole output path."""
    need = BACKEND_PACKAGES.get(recipe.backend.value, ())
    if missing := missing_packages(need):
        raise UsageError(
            f"backend: {recipe.backend.value} needs {' and '.join(need)}, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed here; they cannot join quantize's core "
            "environment (GPTQModel 7.0-7.6 pins numpy 2.2.6). `make gptq-env` builds one with them: run the recipe "
            "with .venv-gptq/bin/quantize run, or use backend: llmcompressor"
        )
    model_dir = resolve_model(recipe.model)
    if recipe.needs_calibration and recipe.calibration is not None:
        source_path(recipe.calibration.source)
    for parent in [out.parent, *out.parent.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(
                    f"output {out}: {parent} is a file, so nothing can be written below it; "
                    "choose another `output:` (or --output)"
                )
            if not os.access(parent, os.W_OK):
                raise UsageError(f"output {out}: {parent} is not writable; choose another `output:` (or --output)")
            break
    if out.exists() and not force:
        raise UsageError(
            f"output {out} already exists; choose another `output:` (or --output), or pass --force to replace it"
        )
    if out.exists() and not (out / "quantize.json").is_file():
        raise UsageError(
            f"output {out} exists and is not a quantize checkpoint; refusing to replace it even with --force"
        )
    return model_dir


def bits_record(report: accounting.BitsReport, source_params: int | None) -> BitsRecord:
    params = source_params or report.parameters
    return BitsRecord(
        total_bytes=report.total_bytes,
        source_parameters=params,
        bits_per_weight=8 * report.total_bytes / params if params else None,
        quantized_linear_bits_per_weight=report.quantized_linear_bits_per_weight,
        quantized_linear_parameters=report.quantized_linear_parameters,
        bytes_by_role=report.bytes_by_role,
        format=report.format,
        modules=report.to_dict()["modules"],
        notes=report.notes,
    )


def _oneshot(model: Any, tok: Any, recipe: Recipe, modifiers: Any, calib: CalibrationSet | None) -> Any:
    """llm-compressor's `oneshot` on our packed calibration tokens (none for data-free schemes)."""
    with cpu_safe_calibration():
        from datasets import Dataset
        from llmcompressor import oneshot

        kwargs: dict[str, Any] = {}
        if calib is not None:
            ids = calib.input_ids.tolist()
            kwargs = dict(
                dataset=Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(ids[0])] * len(ids)}),
                num_calibration_samples=len(ids),
                max_seq_length=len(ids[0]),
                shuffle_calibration_samples=False,
            )
        try:
            return oneshot(model=model, processor=tok, recipe=modifiers, **kwargs) or model
        except (ValueError, KeyError) as e:
            if recipe.method is Method.llmcompressor:
                raise UsageError(f"llm-compressor rejected the verbatim `stages:` recipe: {e}") from None
            raise RuntimeFailure(f"llm-compressor failed: {type(e).__name__}: {e}") from e


def _gptqmodel(model_dir: Path, recipe: Recipe, dtype: Any, calib: CalibrationSet) -> Any:
    """GPTQModel's own GPTQ (Frantar et al. 2023) or AWQ (Lin et al. 2024) on our calibration tokens: bits from the
    scheme, `group_size` (per channel: -1), `symmetric` -> sym (AWQ: zero_point = not sym); GPTQ's `act_order` ->
    desc_act (GPTQModel stores g_idx) and `dampening_frac` -> damp_percent; AWQ in AutoAWQ's GEMM layout, through
    GPTQModel's torch kernel on a CPU (its default kernel asks for CUDA). The group divides every layer (checked in
    `_convert`). Returns GPTQModel's model wrapper, quantized."""
    # GPTQModel 7.6 sizes its CPU thread pools from this and stops with "requests 2 workers but parent 'cpu'
    # only has 1" on a 2-core machine without it
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, os.cpu_count() or 2)))
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.quantization import FORMAT, METHOD
    from gptqmodel.utils.backend import BACKEND

    from quantize.convert.recipe import WEIGHT_ONLY_INT

    assert recipe.scheme_or_none is not None and calib is not None
    common = dict(
        bits=WEIGHT_ONLY_INT[recipe.scheme_or_none],
        group_size=recipe.weight_group or -1,
        sym=getattr(recipe, "symmetric", True),
    )
    if recipe.method is Method.awq:
        qcfg = QuantizeConfig(**common, desc_act=False, quant_method=METHOD.AWQ, format=FORMAT.GEMM)
        backend = BACKEND.AWQ_TORCH if device() == "cpu" else BACKEND.AUTO
    else:
        qcfg = QuantizeConfig(
            **common,
            desc_act=getattr(recipe, "act_order", False),
            damp_percent=getattr(recipe, "dampening_frac", 0.01),
        )
        backend = BACKEND.AUTO
    model = GPTQModel.load(str(model_dir), qcfg, **({"dtype": dtype} if dtype is not None else {}))
    ids = calib.input_ids.tolist()
    with cpu_safe_calibration():
        model.quantize([{"input_ids": r, "attention_mask": [1] * len(r)} for r in ids], batch_size=1, backend=backend)
    return model


def _release(llmcompressor: bool) -> None:
    """Let the quantized model's memory go once the caller has dropped it: llm-compressor's session holds it too."""
    import gc

    if llmcompressor:
        from llmcompressor.core import reset_session

        reset_session()
    gc.collect()


def convert(
    recipe: Recipe, recipe_sha256: str, recipe_path: str, out: Path, force: bool = False, quiet: bool = False
) -> RunRecord:
    """Check everything checkable (before torch is imported), then convert; `quiet` silences the
    libraries for the whole run."""
    model_dir = preflight(recipe, out, force)
    with quiet_libraries(quiet):
        return _convert(recipe, recipe_sha256, recipe_path, model_dir, out, force)


def _convert(
    recipe: Recipe, recipe_sha256: str, recipe_path: str, model_dir: Path, out: Path, force: bool
) -> RunRecord:
    import torch

    phases = Phases()
    started = dt.datetime.now(dt.UTC)
    gptqmodel = recipe.backend is Backend.gptqmodel
    with phases("plan"):
        plan = (
            plan_layers(meta_model(model_dir, recipe.trust_remote_code), recipe)
            if recipe.method is not Method.llmcompressor
            else LayerPlan()
        )
        modifiers = [] if gptqmodel else compile_modifiers(recipe, plan)
        if gptqmodel and (len(plan.groups) > 1 or plan.kept):
            odd = sorted(
                {n for g, names in plan.groups.items() if g != recipe.weight_group for n in names} | set(plan.kept)
            )
            raise UsageError(
                f"backend: gptqmodel with group_size {recipe.weight_group}: {len(odd)} layer(s) (e.g. {odd[0]}) have "
                "input features the group does not divide, and GPTQModel writes their other group size as a per-module "
                "`dynamic` override, which transformers cannot load (GPTQModel warns so; measured: the reload fails). "
                "Choose a group_size that divides every layer's input features (64 for SmolLM2's 576), or use "
                "backend: llmcompressor"
            )
    with phases("load"):
        work_dtype, dtype_reason = calibration_dtype(recipe, model_dir)
        torch_dtype = None if work_dtype == "auto" else getattr(torch, work_dtype)
        if gptqmodel:  # GPTQModel loads the model itself, at quantize time
            from transformers import AutoTokenizer

            model, tok = None, AutoTokenizer.from_pretrained(str(model_dir))
        else:
            model, tok = load_model(model_dir, recipe.trust_remote_code, dtype=torch_dtype or "auto")
        save_dtype = source_dtype(model_dir)
        source_hash = recorded_weights_sha256(model_dir)
        source_params = accounting.parameter_count(model_dir)
    calib: CalibrationSet | None = None
    if recipe.needs_calibration:
        with phases("tokenize"):
            calib = build_calibration(tok, recipe.calibration)
    seed = recipe.calibration.seed if recipe.calibration else 0
    torch.manual_seed(seed)
    with phases("quantize"):
        if gptqmodel:
            assert calib is not None, "GPTQ needs calibration data (the recipe schema requires it)"
            model = _gptqmodel(model_dir, recipe, torch_dtype, calib)
            modifiers = [model.quantize_config]  # what ran, recorded like llm-compressor's modifiers
        else:
            model = _oneshot(model, tok, recipe, modifiers, calib)
    # what the saved checkpoint is run on after reloading: its logits must be finite (the one finiteness check:
    # it sees what is shipped, after any cast, and names the first non-finite layer)
    probe = (
        calib.input_ids[:2, :128]
        if calib is not None
        else torch.tensor([tok("The quick brown fox jumps over the lazy dog.")["input_ids"]])
    )
    with atomic_dir(out, replace=force) as tmp:
        with phases("save"):
            if gptqmodel:
                model.save(str(tmp))
            else:
                model.save_pretrained(tmp, save_compressed=True)
            tok.save_pretrained(tmp)
            if work_dtype != "auto" and save_dtype != work_dtype:
                cast_saved_floats(tmp, save_dtype)
        with phases("reload-check"):
            del model  # the quantized model in memory goes before a second copy loads
            _release(llmcompressor=not gptqmodel)
            finite = [reload_check(tmp, probe, recipe.trust_remote_code)]
        with phases("account"):
            report = accounting.bits_report(tmp)
            out_hash = weights_sha256(tmp)
        resolved = resolved_dict(recipe)
        meta = RunRecord(
            created=started.isoformat(timespec="seconds"),
            recipe=RecipeRef(
                path=recipe_path, sha256=recipe_sha256, resolved=resolved, resolved_sha256=sha256_json(resolved)
            ),
            method=recipe.method.value,
            scheme=recipe.scheme_or_none.value if recipe.scheme_or_none else None,
            source_model=SourceModel(path=str(model_dir), weights_sha256=source_hash, parameters=source_params),
            weights_sha256=out_hash,
            calibration=calib.record if calib else None,
            seed=seed,
            layer_plan=plan.record(),
            engine=EngineRecord(
                backend=recipe.backend.value,
                modifiers=modifiers if isinstance(modifiers, str) else [repr(m) for m in modifiers],
                calibration_dtype=work_dtype,
                saved_dtype=save_dtype,
                calibration_dtype_reason=dtype_reason,
            ),
            versions=library_versions(),
            time_seconds=dict(phases.seconds, total=phases.total()),
            memory=MemoryRecord(**memory_record()),
            finite_checks=finite,
            bits=bits_record(report, source_params),
        )
        records.write(tmp / "quantize.json", meta)
        (tmp / "README.md").write_text(model_card(meta, DEFAULT_MODEL_HUB_ID if recipe.model is None else None))
    return meta
