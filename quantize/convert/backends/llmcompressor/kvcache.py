"""A quantized KV cache (llm-compressor's `kv_cache_scheme`) against the model, before it loads: compressed-tensors
quantizes the KV cache through its own `QuantizedKVCache`, hooked on each attention module, and sizes its scales from
the decoder config. Where that cannot hold the model's cache, the recipe is refused (exit 2) naming the library's
version and what to do, instead of a traceback from inside calibration (exit 3):

- compressed-tensors reads one head size for the whole model (`compressed_tensors.utils.get_head_dim(config)`):
  asked of a config whose layers have different head sizes (Gemma 4's per_layer_config: its full-attention layers'
  head_dim), it raises; the refusal comes from asking the library itself on the config transformers builds;
- its `QuantizedKVCache` stands in for the model's cache and implements what a cache's `update` does, and nothing
  else: an attention that keeps more in the cache (DeepSeek-V3.2's sparse-attention indexer keeps its own keys
  there, `update_indexer`) fails on it. Whether a model keeps indexer keys is its config's (architecture.cache_spec
  of its fields as the config class names them: the "MLA + indexer" layout); whether the library's cache holds them
  is asked of its class, so a compressed-tensors that adds it lifts the refusal.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

from quantize.checkpoint.architecture import cache_spec
from quantize.checkpoint.files import hf_path
from quantize.convert.plan import config_fields
from quantize.errors import UsageError

# the cache method an indexer's keys go through (transformers' Cache.update_indexer, 5.17)
INDEXER_UPDATE = "update_indexer"
WHAT_TO_DO = (
    "Nothing was loaded. Drop `kv_cache:` from the recipe (the weights' scheme converts as it is) and leave the KV "
    "cache to the serving engine, or use a compressed-tensors release that lifts this"
)


def check_kv_cache(model_dir: Path, recipe: Any) -> None:
    """Refuse (UsageError) a recipe with `kv_cache:` whose cache compressed-tensors cannot quantize on this model
    (module docstring); nothing for a recipe without one."""
    if getattr(recipe, "kv_cache", None) is None:
        return
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(hf_path(model_dir), trust_remote_code=recipe.trust_remote_code)
    config = config.get_text_config()
    if why := _head_dim_problem(config) or _indexer_problem(config):
        raise UsageError(f"kv_cache: cannot run on {model_dir} (model_type {config.model_type}): {why}. {WHAT_TO_DO}")


def _head_dim_problem(config: Any) -> str | None:
    """Why compressed-tensors has no one head size for the model's (decoder) config, or None."""
    from compressed_tensors.utils import get_head_dim

    try:
        get_head_dim(config)
    except (AttributeError, RuntimeError, ValueError) as e:
        return (
            f"compressed-tensors {version('compressed-tensors')} sizes every layer's KV scales from one head_dim "
            f"(its get_head_dim of the decoder config), and this model's layers have different head sizes: "
            f"{str(e).splitlines()[0][:160]}"
        )
    return None


def _indexer_problem(config: Any) -> str | None:
    """Why compressed-tensors' QuantizedKVCache cannot stand in for this model's cache (an indexer's keys), or None."""
    from compressed_tensors.modeling.kvcache import QuantizedKVCache

    try:
        layout = cache_spec(config_fields(config)).attention
    except UsageError:  # a layout the cost model does not know says nothing of the indexer here
        return None
    if "indexer" not in layout or hasattr(QuantizedKVCache, INDEXER_UPDATE):
        return None
    return (
        f"its sparse attention keeps an indexer's keys in the KV cache beside the attention's ({layout}), and "
        f"compressed-tensors {version('compressed-tensors')}'s quantized KV cache (QuantizedKVCache, which stands in "
        f"for the model's cache during calibration) implements only `update`, not `{INDEXER_UPDATE}`"
    )
