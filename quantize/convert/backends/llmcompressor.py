"""llm-compressor: `oneshot` with the modifiers our recipe compiles to (modifiers.py), or a verbatim `stages:`
section; writes the compressed-tensors format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from quantize.checkpoint.files import read_config
from quantize.convert.backends import Job
from quantize.convert.modifiers import compile_modifiers
from quantize.convert.plan import LayerPlan
from quantize.convert.recipe import Method, Recipe
from quantize.convert.runtime import cpu_safe_calibration
from quantize.errors import RuntimeFailure, UsageError


class LLMCompressorBackend:
    name = "llmcompressor"
    packages: tuple[str, ...] = ()
    library = "llmcompressor"
    credit = "llm-compressor"
    card_tags = ("compressed-tensors", "llm-compressor")
    formats: ClassVar[dict[str, str]] = {"*": "compressed-tensors format"}
    load_note: ClassVar[dict[str, str]] = {"*": "(compressed-tensors installed)"}

    def prepare(self, recipe: Recipe, plan: LayerPlan) -> Any:
        return compile_modifiers(recipe, plan)

    def load(self, model_dir: Path, recipe: Recipe, dtype: Any, offload_dir: Path | None = None) -> tuple[Any, Any]:
        from quantize.checkpoint.loader import load_model

        return load_model(model_dir, recipe.trust_remote_code, dtype=dtype or "auto", offload_dir=offload_dir)

    def quantize(self, job: Job) -> tuple[Any, Any]:
        """`oneshot` on our packed calibration tokens (none for data-free schemes)."""
        recipe, calib = job.recipe, job.calib
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
            if job.offloaded:  # one decoder layer at a time in memory, the others on disk
                kwargs["pipeline"] = "sequential"
            try:
                ran = oneshot(model=job.model, processor=job.tok, recipe=job.prepared, **kwargs) or job.model
                return ran, serialized(job.prepared)
            except (ValueError, KeyError) as e:
                if recipe.method is Method.llmcompressor:
                    raise UsageError(f"llm-compressor rejected the verbatim `stages:` recipe: {e}") from None
                raise RuntimeFailure(f"llm-compressor failed: {type(e).__name__}: {e}") from e

    def save(self, model: Any, folder: Path) -> None:
        model.save_pretrained(folder, save_compressed=True)

    def stream(self, model_dir: Path, folder: Path, prepared: Any) -> str:
        """A data-free recipe shard by shard: `model_free_ptq` with the same config groups (the layer plan's
        names as targets) and ignore list as `oneshot`, so the stored tensors are the same bytes. Each shard is
        written with save_pretrained's header metadata ({"format": "pt"}) and config.json as save_pretrained writes
        it (sorted keys, the empty sparsity_config compressed-tensors adds), so a single-file output's
        model.safetensors and config.json are byte-identical to the in-memory path's
        (tests/convert/test_streaming.py), and recipe.yaml as save_pretrained writes it. Returns what ran (as
        `quantize` does), serialized before model_free_ptq, which sets the format on the config groups it is given."""
        from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

        from quantize.compat.llmcompressor import model_free_ptq_pt

        ran = serialized(prepared)
        (modifier,) = prepared  # streamable recipes compile to one QuantizationModifier (memory.STREAMABLE)
        config = QuantizationConfig(
            config_groups=modifier.config_groups,
            ignore=list(modifier.ignore),
            quantization_status=QuantizationStatus.INITIALIZED,
        )
        try:
            model_free_ptq_pt(model_dir, folder, config)  # every shard with save_pretrained's header metadata
        except (ValueError, KeyError) as e:
            raise RuntimeFailure(f"llm-compressor's model_free_ptq failed: {type(e).__name__}: {e}") from e
        cfg = read_config(folder)
        cfg["quantization_config"].setdefault("sparsity_config", {})
        (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        (folder / "recipe.yaml").write_text(ran)
        return ran

    def release(self) -> None:
        """llm-compressor's session holds the quantized model too."""
        import gc

        from llmcompressor.core import reset_session

        reset_session()
        gc.collect()




def serialized(prepared: Any) -> str:
    """What ran, as llm-compressor's own recipe YAML (a verbatim `stages:` recipe as given; compiled modifiers
    through `Recipe.from_modifiers(...).yaml()`), which `llmcompressor.recipe.Recipe.create_instance` loads back."""
    if isinstance(prepared, str):
        return prepared
    from llmcompressor.recipe import Recipe as LlmcRecipe

    return LlmcRecipe.from_modifiers(prepared).yaml()
