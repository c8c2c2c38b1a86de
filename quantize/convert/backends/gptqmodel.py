"""GPTQModel: its own GPTQ (Frantar et al. 2023) or AWQ (Lin et al. 2024) on our calibration tokens, written in
GPTQModel's GPTQ format or AutoAWQ's GEMM layout. Needs gptqmodel and optimum (`make gptq-env`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from quantize.checkpoint.files import hf_path
from quantize.checkpoint.loader import device
from quantize.compat.gptqmodel import defused, restore_rope
from quantize.convert.backends.base import CalibrationDtype, Job
from quantize.convert.plan import INDIVISIBLE, LayerPlan
from quantize.convert.recipe import WEIGHT_ONLY_INT, AWQRecipe, GPTQRecipe, Method, Recipe, Scheme
from quantize.errors import UsageError

# GPTQModel's AWQ searches a fixed grid of 20 points per scale (its awq_processor's n_grid)
AWQ_GRID = 20


class GPTQModelBackend:
    name = "gptqmodel"
    packages = ("gptqmodel", "optimum")
    install = (
        "they cannot join quantize's core environment (GPTQModel 7.0-7.6 pins numpy 2.2.6). `make gptq-env` builds one "
        "with them: run the recipe with .venv-gptq/bin/quantize run, or use backend: llmcompressor"
    )
    library = "gptqmodel"
    credit = "GPTQModel"
    card_tags = ("gptqmodel",)
    formats: ClassVar[dict[str, str]] = {"awq": "AutoAWQ's GEMM format", "*": "GPTQModel's GPTQ format"}
    load_note: ClassVar[dict[str, str]] = {
        "awq": "(gptqmodel installed: AutoAWQ's GEMM format, written by GPTQModel)",
        "*": "(optimum and gptqmodel installed: GPTQModel's GPTQ format)",
    }
    # its own GPTQ and AWQ in their native formats: GPTQ (transformers loads it through optimum and gptqmodel) and
    # AutoAWQ's GEMM layout (through gptqmodel), 4-bit only for AWQ (the GEMM packing's width)
    schemes: ClassVar[dict[Method, frozenset[Scheme]] | None] = {
        Method.gptq: frozenset(WEIGHT_ONLY_INT),
        Method.awq: frozenset({Scheme.W4A16}),
    }
    kv_cache: ClassVar[bool] = False
    streams: ClassVar[frozenset[tuple[Method, Scheme]]] = frozenset()  # it loads the whole model
    offloads: ClassVar[bool] = False
    linearizes_experts: ClassVar[bool] = False  # its own module selection, at quantize time
    file_to_file: ClassVar[bool] = False  # it converts a loaded model
    calibration_dtypes: ClassVar[dict[Method, CalibrationDtype]] = {
        Method.awq: CalibrationDtype(
            ("float16", "bfloat16"), "bfloat16", "GPTQModel's AWQ packs from float16/bfloat16 weights only"
        )
    }

    @classmethod
    def check(cls, recipe: Recipe) -> str | None:
        """AWQ on its own grid and from 16-bit weights only, and every Linear of the decoder blocks (its own module
        selection) without per-layer overrides."""
        if getattr(recipe, "awq_grid", AWQ_GRID) != AWQ_GRID:
            return (
                f"backend gptqmodel searches AWQ's scales on a fixed grid of {AWQ_GRID} points, so awq_grid "
                f"{recipe.awq_grid} cannot be honoured: remove awq_grid, or use backend: llmcompressor"
            )
        if recipe.method is Method.awq and recipe.dtype not in (None, "float16", "bfloat16"):
            return (
                f"backend gptqmodel packs AWQ weights from float16 or bfloat16 only (its AwqTorchLinear refuses "
                f"others), so dtype {recipe.dtype} cannot be used: set dtype to bfloat16 or float16, remove it, or "
                "use backend: llmcompressor"
            )
        if recipe.targets != ["Linear"] or recipe.ignore != ["lm_head"] or getattr(recipe, "overrides", None):
            return (
                "backend gptqmodel quantizes every Linear of the decoder blocks and keeps lm_head, its own "
                "selection: remove targets, ignore and overrides from the recipe, or use backend: llmcompressor"
            )
        return None

    def prepare(self, recipe: Recipe, plan: LayerPlan) -> Any:
        """GPTQModel writes a second group size, or a layer left out, as a per-module `dynamic` override, which
        transformers cannot load (measured for a second group size): the group must divide every layer, and the
        plan may keep no layer at 16 bits (an MoE's routers, an override). It configures itself from the recipe."""
        g = recipe.weight_group
        odd = sorted(
            {n for size, names in plan.groups.items() if size != g for n in names}
            | {n for n, why in plan.kept.items() if why.startswith(INDIVISIBLE)}
        )
        if odd:
            raise UsageError(
                f"backend: gptqmodel with group_size {g}: {len(odd)} layer(s) (e.g. {odd[0]}) have "
                "input features the group does not divide, and GPTQModel writes their other group size as a per-module "
                "`dynamic` override, which transformers cannot load (GPTQModel warns so; measured: the reload fails). "
                "Choose a group_size that divides every layer's input features (64 for SmolLM2's 576), or use "
                "backend: llmcompressor"
            )

        if defused(plan.model_type):
            raise UsageError(
                f"backend: gptqmodel on a {plan.model_type} model: GPTQModel (through its defuser) splits this "
                "family's fused projections (Phi-3's mlp.gate_up_proj into gate_proj and up_proj), quantizes them "
                "apart and writes them so, a layout transformers' own class for the family does not load (measured "
                "on Phi-3: the reload finds gate_up_proj missing), so the run stops before loading. Use backend: "
                "llmcompressor (e.g. recipes/gptq-w4a16-g128.yaml), which writes the family's own layout"
            )
        if plan.kept:
            name, why = sorted(plan.kept.items())[0]
            raise UsageError(
                f"backend: gptqmodel: the layer plan keeps {len(plan.kept)} layer(s) at 16 bits (e.g. {name}: {why}); "
                "GPTQModel would have to write each as a per-module `dynamic` exclusion, which is not checked to load "
                "in transformers here, so the run stops before loading. Use backend: llmcompressor, which keeps them"
            )
        return None

    def load(self, model_dir: Path, recipe: Recipe, dtype: Any, offload_dir: Path | None = None) -> tuple[Any, Any]:
        """The tokenizer only: GPTQModel loads the model itself, at quantize time."""
        from transformers import AutoTokenizer

        return None, AutoTokenizer.from_pretrained(hf_path(model_dir))

    def quantize(self, job: Job) -> tuple[Any, Any]:
        """Bits from the scheme, `group_size` (per channel: -1), `symmetric` -> sym (AWQ: zero_point = not sym);
        GPTQ's `act_order` -> desc_act (GPTQModel stores g_idx) and `dampening_frac` -> damp_percent; AWQ in
        AutoAWQ's GEMM layout, through GPTQModel's torch kernel on a CPU (its default kernel asks for CUDA). The
        config's RoPE parameters are the source's when it returns (GPTQModel's initializer adds keys to them).
        Returns GPTQModel's model wrapper, quantized, and its QuantizeConfig (what ran)."""
        # GPTQModel 7.6 sizes its CPU thread pools from this and stops with "requests 2 workers but parent 'cpu'
        # only has 1" on a 2-core machine without it
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, os.cpu_count() or 2)))
        from gptqmodel import GPTQModel, QuantizeConfig
        from gptqmodel.quantization import FORMAT, METHOD
        from gptqmodel.utils.backend import BACKEND

        recipe = job.recipe
        assert isinstance(recipe, GPTQRecipe | AWQRecipe), "recipe validation admits GPTQ and AWQ only here"
        assert recipe.scheme_or_none is not None and job.calib is not None
        common = dict(bits=WEIGHT_ONLY_INT[recipe.scheme_or_none], group_size=recipe.weight_group or -1)
        if isinstance(recipe, AWQRecipe):
            qcfg = QuantizeConfig(
                **common, sym=recipe.symmetric, desc_act=False, quant_method=METHOD.AWQ, format=FORMAT.GEMM
            )
            backend = BACKEND.AWQ_TORCH if device() == "cpu" else BACKEND.AUTO
        else:
            qcfg = QuantizeConfig(
                **common, sym=recipe.symmetric, desc_act=recipe.act_order, damp_percent=recipe.dampening_frac
            )
            backend = BACKEND.AUTO
        model = GPTQModel.load(str(job.model_dir), qcfg, **({"dtype": job.dtype} if job.dtype is not None else {}))
        rows = [{"input_ids": r, "attention_mask": [1] * len(r)} for r in job.calib.input_ids.tolist()]
        model.quantize(rows, batch_size=1, backend=backend)
        # GPTQModel 7.6's RoPE initializer added keys to a per-layer-type rope_parameters (Gemma 3) that
        # save_pretrained refuses: the source's go back (quantize/compat/gptqmodel.py)
        restore_rope(model.model.config, job.model_dir)
        return model, repr(model.quantize_config)  # GPTQModel's own config (also saved as quantize_config.json)

    def save(self, model: Any, folder: Path) -> None:
        model.save(str(folder))

    def release(self) -> None:
        import gc

        gc.collect()

    def routing(self) -> list[Any]:
        """GPTQModel's calibration is its own; it does not report routing."""
        return []
