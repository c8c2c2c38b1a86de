"""transformers' internals this project relies on (checked on 5.17.0).

- What `from_pretrained` does with a checkpoint's tensors before it reads a value: `core_model_loading.
  convert_and_load_state_dict_in_model(model, state_dict, load_config)` with a `modeling_utils.LoadStateDictConfig`
  carrying the model's conversion mapping (`conversion_mapping.get_model_conversion_mapping`: its renamings and
  per-expert merges) and a device map, then the model's `tie_weights(missing_keys=..., recompute_mapping=False)`
  and its private `_adjust_missing_and_unexpected_keys(loading_info)` (the class's ignore patterns), as
  `_finalize_model_loading` calls them. `dry_load` runs exactly that on a meta-device model with meta tensors of
  the headers' shapes: the missing, unexpected and mis-shaped keys and the failed merges a real load would report,
  with no weight read and nothing allocated (convert/checks.check_source).
- A family's checkpoint conversions: `conversion_mapping.get_checkpoint_conversion_mapping(model_type)`, a list of
  `core_model_loading.WeightTransform`s, each with `source_patterns` and `target_patterns`; a `WeightRenaming` is a
  plain renaming of a name part (Mixtral's `.block_sparse_moe.` -> `.mlp.`), any other transform (a
  `WeightConverter`) merges the source tensors into the target (Mixtral's per-expert `.experts.*.w1.weight` and
  `.experts.*.w3.weight` into `.experts.gate_up_proj`). `conversions` reads them as data (plan.py: the names a
  per-expert checkpoint must use to reload, and whether a family has a per-expert loader at all); `problems()`
  checks them on Mixtral as read (MIXTRAL_READ).

- A family whose fused experts transformers swaps, for a quantized checkpoint, for per-expert layers before the
  weights load: `quantizers.base.MODULES_TO_PATCH_FOR_QUANTIZATION` (experts class name -> {"module_name",
  "quantization_methods"}), applied by `HfQuantizer._convert_model_for_quantization`. On 5.17 it lists Llama 4's
  `Llama4TextExperts` for compressed-tensors (and bitsandbytes): a compressed-tensors Llama 4 is read per expert
  (`experts.N.gate_proj`, ...), one Llama4TextMLP each, whatever its format, and not fused. `quantized_per_expert`
  reads it as data (the layout a conversion writes: plan.py, the backend's save); `problems()` checks it as read
  (PATCHED_READ).

- How it reads a per-expert compressed-tensors MoE checkpoint's quantized experts: `quantizers.
  quantizer_compressed_tensors.CompressedTensorsHfQuantizer(config)`, its `validate_environment()` and
  `update_weight_conversions(conversions)` (which stored tensors each expert converter reads: on 5.17 `weight` and
  `weight_scale` for FP8, `weight_packed`, `weight_scale`, `weight_shape` for the rest), and the converter's first op,
  `integrations.compressed_tensors.DecompressExperts`, whose `convert(input_dict, source_patterns=,
  target_patterns=)` dequantizes them. `expert_reading` runs exactly that on one stored expert and compares it with
  compressed-tensors' own decompression (decompressed.transformers_reading: quantize.json's reload stage, the model
  card); `problems()` checks the names and signatures (_expert_reading_problems); tests/compat/
  test_transformers_experts.py pins what 5.17 makes of FP8, NVFP4A16 and asymmetric experts.

- Each config class's `attribute_map` (the name a field is stored under, and the other names that set it), copied
  for the light readers in compat/transformers_config_names.py; `problems()` compares the copy with the classes.

- Each family model's `_keys_to_ignore_on_load_unexpected` patterns that name a multi-token-prediction module
  stored under a prefix of its own (`mtp.*`: Qwen3-Next, Qwen3.5, Nemotron-H), which
  `_adjust_missing_and_unexpected_keys` drops from the unexpected keys (re.search on each stored name): copied for
  the light readers as transformers_config_names.MTP_UNEXPECTED; `problems()` compares the copy with the classes
  (library_mtp_patterns).

- config.json completed by its family's config class: `CONFIG_MAPPING[model_type](**config)` (what
  `AutoConfig.from_pretrained` runs through `from_dict`, less the hub and remote code) and its `to_dict()`, which holds
  every field the class derives in `__post_init__` or takes by default (`completed_config`: the cost model's reading).
  Before that, the file's special floats decoded as `from_pretrained` decodes them: the private
  `PreTrainedConfig._decode_special_floats` (save_pretrained writes infinity as `{"__float__": "Infinity"}`,
  Nemotron-H's time_step_limit, and the class refuses the object); `problems()` checks it (CONFIG_FLOATS_READ).
- A GGUF's header read as config.json: `modeling_gguf_pytorch_utils.load_gguf_checkpoint(path,
  return_tensors=False)["config"]` (no tensor read), for the architectures `integrations.ggml.GGUF_CONFIG_MAPPING`
  maps; `gguf_config` (the cost of a GGUF whose KV cache only the family's config class can lay out).

- The names `save_pretrained` writes a model's tensors under: `core_model_loading.revert_weight_conversion(model,
  state_dict)` reverses the model's conversion mapping (the one it was loaded with, `model._weight_conversions`,
  else `conversion_mapping.get_model_conversion_mapping(model, add_legacy=False)` less its `PrefixChange`s), each
  transform's `reverse_transform()`, in reverse order, and renames every key with `rename_source_key(key,
  renamings, converters, reverse=True)`. `saved_names` runs that renaming alone (no tensor, no converter): the
  stored name of a module transformers renames on load (Nemotron-H's `model.` stored `backbone.`, Kimi-Linear's
  `self_attn.forget_gate.f_a_proj` stored `self_attn.f_a_proj`); `problems()` checks it on Mixtral (SAVED_READ).

- The dtype `from_pretrained(dtype=...)` loads each tensor in: the requested dtype, but the modules the class keeps
  in float32 (`_keep_in_fp32_modules_strict` for bfloat16 and float16, `_keep_in_fp32_modules` for float16), which
  it reads through the model's private `_get_dtype_plan(dtype)` and hands `convert_and_load_state_dict_in_model` as
  LoadStateDictConfig's `dtype` and `dtype_plan`. `loaded_dtypes` runs that on a meta-device model (no weight
  read): the dtype the in-memory path holds and saves each tensor in, which the streamed path and a float32
  calibration's cast write too (convert/dtypes.held_dtypes); `problems()` checks the names (_dtype_plan_problems).

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on any).
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, fields, is_dataclass
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

from quantize.compat import outside
from quantize.compat import transformers_config_names as config_names
from quantize.errors import UsageError

CHECKED = ((5, 17), (5, 18))  # [from, to): the versions the assumptions above were read on


class Conversion(NamedTuple):
    """One transform transformers applies to a family's checkpoint tensors on load: the name patterns it reads,
    those it writes, and whether it only renames (else it merges the sources into the target)."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    renaming: bool


# Mixtral's conversions as read on 5.17: the checkpoint's block_sparse_moe renamed, its per-expert w1/w3 and w2
# merged into the fused experts (problems() compares the library's with these)
MIXTRAL_READ = (
    Conversion((".block_sparse_moe.",), (".mlp.",), True),
    Conversion((".experts.*.w1.weight", ".experts.*.w3.weight"), (".experts.gate_up_proj",), False),
    Conversion((".experts.*.w2.weight",), (".experts.down_proj",), False),
)


# quantizers.base.MODULES_TO_PATCH_FOR_QUANTIZATION's compressed-tensors entries as read on 5.17
PATCHED_READ = frozenset({"Llama4TextExperts"})


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, a function or field gone or re-signed."""
    from transformers import PreTrainedModel
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig

    found = []
    if why := outside("transformers", version("transformers"), CHECKED):
        found.append(why)
    params = list(inspect.signature(convert_and_load_state_dict_in_model).parameters)
    if params[:3] != ["model", "state_dict", "load_config"]:
        found.append(f"convert_and_load_state_dict_in_model takes {params}, not (model, state_dict, load_config)")
    have = {f.name for f in fields(LoadStateDictConfig)}
    found += [f"LoadStateDictConfig has no `{f}`" for f in ("weight_mapping", "device_map") if f not in have]
    if "model" not in inspect.signature(get_model_conversion_mapping).parameters:
        found.append("get_model_conversion_mapping takes no `model`")
    if not callable(getattr(PreTrainedModel, "_adjust_missing_and_unexpected_keys", None)):
        found.append("PreTrainedModel has no _adjust_missing_and_unexpected_keys")
    tie = inspect.signature(PreTrainedModel.tie_weights).parameters
    found += [
        f"PreTrainedModel.tie_weights takes no `{p}`" for p in ("missing_keys", "recompute_mapping") if p not in tie
    ]
    found += _gguf_problems() + _conversion_problems() + _patch_problems() + _config_problems()
    found += _expert_reading_problems()
    found += config_name_problems(sorted(config_names.ATTRIBUTE_MAPS)) + sliding_switch_problems()
    return found + mtp_pattern_problems() + _saved_name_problems() + _dtype_plan_problems()


# a Mixtral module's name in memory and as save_pretrained writes it on 5.17 (its `.block_sparse_moe.` renaming)
SAVED_READ = ("model.layers.0.mlp.gate.weight", "model.layers.0.block_sparse_moe.gate.weight")


def _saved_name_problems() -> list[str]:
    """What no longer holds of `saved_names`' reading: the functions gone, or Mixtral's gate saved otherwise."""
    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig

    tiny = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, vocab_size=32)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(MixtralConfig(num_hidden_layers=1, num_local_experts=2, **tiny))
        got = saved_names(model, [SAVED_READ[0]])[SAVED_READ[0]]
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        return [f"the renaming save_pretrained applies to tensor names is not as read ({type(e).__name__}: {e})"]
    if got != SAVED_READ[1]:
        return [f"save_pretrained writes Mixtral's {SAVED_READ[0]} as {got}, read as {SAVED_READ[1]}"]
    return []


def saved_names(model: Any, names: list[str]) -> dict[str, str]:
    """Each of `names` (tensor names of `model`, a transformers model, as it holds them) as save_pretrained writes
    it: the renamings of the model's conversion mapping reversed, as `revert_weight_conversion` applies them (the
    module docstring); a name no renaming touches is itself."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange, WeightRenaming, rename_source_key

    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        mapping = get_model_conversion_mapping(model, add_legacy=False)
        conversions = [c for c in mapping if not isinstance(c, PrefixChange)]
    reverse = [c.reverse_transform() for c in conversions[::-1]]
    renamings = [c for c in reverse if isinstance(c, WeightRenaming)]
    return {n: rename_source_key(n, renamings, [], reverse=True)[0] for n in names}


# what `_decode_special_floats` was read to do on 5.17: a tagged float back to the float, through dicts and lists
CONFIG_FLOATS_READ = ({"a": [0.0, {"__float__": "Infinity"}]}, {"a": [0.0, float("inf")]})


def _config_problems() -> list[str]:
    """What no longer holds of `completed_config`'s reading: the special floats' decoder gone or other."""
    from transformers import PreTrainedConfig

    decode = getattr(PreTrainedConfig, "_decode_special_floats", None)
    given, read = CONFIG_FLOATS_READ
    try:
        got = decode(copy.deepcopy(given)) if callable(decode) else "absent"
    except Exception as e:  # whatever it raises is the change to report
        got = f"{type(e).__name__}: {e}"
    if got != read:
        return [f"PreTrainedConfig._decode_special_floats({given}) gives {got!r}, read as {read}"]
    return []


def _gguf_problems() -> list[str]:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    found = []
    if "return_tensors" not in inspect.signature(load_gguf_checkpoint).parameters:
        found.append("load_gguf_checkpoint takes no `return_tensors`")
    if not isinstance(GGUF_CONFIG_MAPPING, dict) or "gemma3" not in GGUF_CONFIG_MAPPING:
        found.append("integrations.ggml.GGUF_CONFIG_MAPPING is not a mapping of architectures holding gemma3")
    return found


def gguf_config(path: Path, architecture: str | None) -> dict[str, Any] | None:
    """config.json as transformers' GGUF loader builds it from the header of the GGUF at `path` (no tensor read), or
    None for an architecture GGUF_CONFIG_MAPPING does not map. Its warning that the header gives no vocab_size
    (a KV layout needs none) is kept off the terminal."""
    import logging

    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    if architecture not in GGUF_CONFIG_MAPPING:
        return None
    library = logging.getLogger("transformers")
    level = library.level
    library.setLevel(logging.ERROR)
    try:
        return dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"])
    finally:
        library.setLevel(level)


def completed_config(config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """`config` (a config.json) as transformers' config class for its model_type holds it: the class built from it
    (`CONFIG_MAPPING[model_type](**config)`, as `AutoConfig.from_pretrained` builds it; never remote code, never the
    hub) and written back with `to_dict()`, so a field the class derives or defaults is there (Qwen3-Next's
    layer_types from full_attention_interval, LFM2's from full_attn_idxs, Gemma 4's per_layer_config from
    global_head_dim, a nested text_config's defaults). A model_type the library does not know (or none): `config`
    unchanged. A value the class refuses: a UsageError naming `where` and the class's message. The library's
    warnings about the values (its logger, Python warnings) are kept off the terminal: the cost is arithmetic."""
    import logging
    import warnings

    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return config
    cls = CONFIG_MAPPING[model_type]
    library = logging.getLogger("transformers")
    level = library.level
    library.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(**cls._decode_special_floats(copy.deepcopy(config))).to_dict()
    except Exception as e:  # what the class raises on the file's values is the file's error
        raise UsageError(
            f"{where}: transformers' {cls.__name__} (model_type {model_type!r}) refuses it: "
            f"{type(e).__name__}: {' '.join(str(e).split())[:300]}. Fix config.json"
        ) from None
    finally:
        library.setLevel(level)


def library_maps(model_types: list[str]) -> dict[str, dict[str, str]]:
    """The entries compat/transformers_config_names.py copies (those touching its READ names), read from each
    family's config class in transformers' CONFIG_MAPPING."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    out = {}
    for m in model_types:
        amap = CONFIG_MAPPING[m].attribute_map
        if kept := {k: v for k, v in amap.items() if k in config_names.READ or v in config_names.READ}:
            out[m] = kept
    return out


def config_name_problems(model_types: list[str]) -> list[str]:
    """Where the copied attribute maps (compat/transformers_config_names.py) differ from the library's config
    classes, for `model_types`: an entry touching its READ names that one side has and the other lacks."""
    library, copied = library_maps(model_types), config_names.ATTRIBUTE_MAPS
    return [
        f"{m}'s config class maps {library.get(m, {})} of the names read, the copy {copied.get(m, {})}"
        for m in model_types
        if library.get(m, {}) != copied.get(m, {})
    ]


# the switched-on config each class with a `use_sliding_window` field is built from (library_switches): its layers
# and window, and the max_window_layers given where the class has that field, other than every default
SWITCH_PROBE = {"num_hidden_layers": 8, "sliding_window": 16, "max_window_layers": 3}


def library_switches() -> dict[str, int | str | None]:
    """Every family of transformers' CONFIG_MAPPING whose config class has a `use_sliding_window` field: which layers
    the class slides switched on (SWITCH_PROBE), as compat/transformers_config_names.py's SLIDING_SWITCH says it: its
    `max_window_layers` default where it slides the layers from max_window_layers on (Qwen2's rule), None where it
    has no such field and slides every layer, config_names.OWN_LAYER_TYPES where its layer_types follow neither;
    the switch's default where it is not False (SLIDING_SWITCH assumes a window off unless switched on), and what the
    class raised where it cannot be built so. The layers a class slides are its layer_types, else (no such field)
    every layer while a window is set, as transformers' cache reads a config
    (cache_utils.get_layer_types_and_kwargs)."""
    import logging
    import warnings

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    out: dict[str, int | str | None] = {}
    library = logging.getLogger("transformers")
    level = library.level
    library.setLevel(logging.ERROR)
    try:
        for m in CONFIG_MAPPING.keys():  # noqa: SIM118 (a lazy mapping: iterating it is not its keys)
            cls = CONFIG_MAPPING[m]
            have = {f.name: f for f in fields(cls)} if is_dataclass(cls) else {}
            if (switch := have.get("use_sliding_window")) is None:
                continue
            if switch.default is not False:
                out[m] = f"default {switch.default!r}"
                continue
            first = have.get("max_window_layers")
            probe = {k: v for k, v in SWITCH_PROBE.items() if k != "max_window_layers" or first}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    built = cls(**probe, use_sliding_window=True)
            except Exception as e:  # what the class raises is the change to report
                out[m] = f"{type(e).__name__} built switched on: {e}"[:160]
                continue
            n, start = SWITCH_PROBE["num_hidden_layers"], SWITCH_PROBE["max_window_layers"] if first else 0
            slid = getattr(built, "layer_types", None) or (
                ["sliding_attention" if built.sliding_window is not None else "full_attention"] * n
            )
            qwen2 = ["sliding_attention" if i >= start else "full_attention" for i in range(n)]
            out[m] = (first.default if first else None) if slid == qwen2 else config_names.OWN_LAYER_TYPES
    finally:
        library.setLevel(level)
    return out


def sliding_switch_problems() -> list[str]:
    """Where SLIDING_SWITCH differs from the library's config classes (library_switches)."""
    library, copied = library_switches(), config_names.SLIDING_SWITCH
    return [
        f"{m}'s config class: use_sliding_window / max_window_layers {library.get(m, 'absent')}, the copy "
        f"{copied.get(m, 'absent')}"
        for m in sorted({*library, *copied})
        if library.get(m, "absent") != copied.get(m, "absent")
    ]


def library_mtp_patterns() -> dict[str, tuple[str, ...]]:
    """Every family (model_type) whose causal LM or image-text-to-text model in transformers' auto mappings ignores
    stored tensors by a `_keys_to_ignore_on_load_unexpected` pattern mentioning "mtp", and those patterns, in the
    sorted order (a class may hold them as a set). Only the modeling modules whose source names both are imported
    (1-2 s, not every family's)."""
    import transformers
    from transformers.models.auto import modeling_auto

    wanted: dict[str, set[str]] = {}
    auto = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    for mapping in auto:
        for model_type, name in mapping.items():
            wanted.setdefault(name, set()).add(model_type)
    out: dict[str, tuple[str, ...]] = {}
    for f in sorted((Path(transformers.__file__).parent / "models").glob("*/modeling_*.py")):
        text = f.read_text(encoding="utf-8")
        if "_keys_to_ignore_on_load_unexpected" not in text or "mtp" not in text:
            continue
        module = import_module(f"transformers.models.{f.parent.name}.{f.stem}")
        for name, model_types in wanted.items():
            cls = vars(module).get(name)
            ignored = getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or ()
            patterns = tuple(sorted(p for p in ignored if "mtp" in p))
            out |= dict.fromkeys(model_types, patterns) if patterns else {}
    return dict(sorted(out.items()))


def mtp_pattern_problems() -> list[str]:
    """Where MTP_UNEXPECTED differs from the library's models (library_mtp_patterns)."""
    library, copied = library_mtp_patterns(), config_names.MTP_UNEXPECTED
    return [
        f"{m}'s model ignores {library.get(m, ())} as its MTP module, the copy {copied.get(m, ())}"
        for m in sorted({*library, *copied})
        if library.get(m, ()) != copied.get(m, ())
    ]


def _conversion_problems() -> list[str]:
    """What no longer holds of `conversions`' reading: the function or the renaming class gone or re-signed, or
    Mixtral's conversions other than MIXTRAL_READ."""
    from transformers import conversion_mapping, core_model_loading

    get = getattr(conversion_mapping, "get_checkpoint_conversion_mapping", None)
    if get is None or list(inspect.signature(get).parameters) != ["model_type"]:
        return ["conversion_mapping.get_checkpoint_conversion_mapping(model_type) is gone or re-signed"]
    if not isinstance(getattr(core_model_loading, "WeightRenaming", None), type):
        return ["core_model_loading.WeightRenaming is gone"]
    if (got := tuple(conversions("mixtral"))) != MIXTRAL_READ:
        return [f"transformers converts Mixtral's checkpoint tensors with {got}, read as {MIXTRAL_READ}"]
    return []


def _patched_for_compressed_tensors() -> frozenset[str]:
    """The fused-experts classes transformers swaps for per-expert layers when it loads a compressed-tensors
    checkpoint (the module docstring)."""
    from transformers.quantizers.base import MODULES_TO_PATCH_FOR_QUANTIZATION
    from transformers.utils.quantization_config import QuantizationMethod

    return frozenset(
        name
        for name, patch in MODULES_TO_PATCH_FOR_QUANTIZATION.items()
        if QuantizationMethod.COMPRESSED_TENSORS in patch.get("quantization_methods", ())
    )


def _patch_problems() -> list[str]:
    """What no longer holds of `quantized_per_expert`'s reading: the table gone, or other classes in it."""
    try:
        got = _patched_for_compressed_tensors()
    except (ImportError, AttributeError, TypeError) as e:
        return [f"transformers.quantizers.base.MODULES_TO_PATCH_FOR_QUANTIZATION is not as read ({e})"]
    if got != PATCHED_READ:
        return [f"transformers patches {sorted(got)} for compressed-tensors, read as {sorted(PATCHED_READ)}"]
    return []


def quantized_per_expert(model_type: str) -> bool:
    """Whether transformers reads a compressed-tensors checkpoint of this family's experts one expert at a time (its
    fused experts class is swapped for per-expert layers before the weights load: Llama 4)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    try:
        modeling = import_module(f"transformers.models.{module}.modeling_{module}")
    except ImportError:
        return False
    return any(isinstance(getattr(modeling, name, None), type) for name in _patched_for_compressed_tensors())


def conversions(model_type: str) -> list[Conversion]:
    """The transforms `from_pretrained` applies to this family's checkpoint tensors on load, in order ([] for a
    family it loads as stored)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    return [
        Conversion(
            tuple(getattr(c, "source_patterns", ())),
            tuple(getattr(c, "target_patterns", ())),
            isinstance(c, WeightRenaming),
        )
        for c in get_checkpoint_conversion_mapping(model_type) or []
    ]


def _expert_reading_problems() -> list[str]:
    """What no longer holds of expert_reading's use of transformers' compressed-tensors loader."""
    try:
        from transformers.integrations.compressed_tensors import DecompressExperts
        from transformers.quantizers.quantizer_compressed_tensors import CompressedTensorsHfQuantizer
    except ImportError as e:
        return [f"transformers' compressed-tensors loader is not where expert_reading reads it ({e})"]
    found = [
        f"CompressedTensorsHfQuantizer has no `{m}`"
        for m in ("update_weight_conversions", "validate_environment")
        if not callable(getattr(CompressedTensorsHfQuantizer, m, None))
    ]
    convert = inspect.signature(DecompressExperts.convert).parameters
    found += [
        f"DecompressExperts.convert takes no `{p}`" for p in ("input_dict", "source_patterns") if p not in convert
    ]
    return found


def expert_reading(
    model_type: str, quantization_config: dict[str, Any], stored: dict[str, Any], scheme: Any
) -> str | None:
    """What transformers' loader makes of one routed expert of a per-expert compressed-tensors checkpoint of
    `model_type` (`stored`: every tensor of one expert projection, by the name the file stores it under, e.g.
    `model.layers.1.mlp.experts.0.down_proj.weight_packed`): None where the weight it dequantizes equals, to its
    bf16 rounding, what compressed-tensors' own decompression gives of all those tensors under `scheme` (the
    checkpoint's for that module); else why not, in a sentence (its error, and the stored tensors it does not
    read). It runs transformers' own code: the experts' converters of the family's conversion mapping as its
    compressed-tensors quantizer rewrites them (`CompressedTensorsHfQuantizer.update_weight_conversions`: which
    stored tensors each reads) and their first op, `integrations.compressed_tensors.DecompressExperts`, on these
    tensors; on 5.17 it reads `weight` and `weight_scale` of FP8 experts and `weight_packed`, `weight_scale`,
    `weight_shape` of the others, so an NVFP4 expert's global scale and an asymmetric one's zero point are dropped
    (EXPERTS_MISREAD, tests/compat)."""
    import re

    import torch
    from compressed_tensors.compressors import BaseCompressor
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.integrations.compressed_tensors import DecompressExperts
    from transformers.quantizers.quantizer_compressed_tensors import CompressedTensorsHfQuantizer
    from transformers.utils.quantization_config import CompressedTensorsConfig

    module = next(iter(stored)).rpartition(".")[0]
    quantizer = CompressedTensorsHfQuantizer(CompressedTensorsConfig.from_dict(copy.deepcopy(quantization_config)))
    quantizer.validate_environment()  # as from_pretrained calls it: the kernel path this machine takes
    converters = quantizer.update_weight_conversions(get_checkpoint_conversion_mapping(model_type) or [])
    for conv in converters:
        ops = list(getattr(conv, "operations", []))
        if not ops or not isinstance(ops[0], DecompressExperts):
            continue
        read = {
            src: [name] for src in conv.source_patterns for name in stored if re.search(src.replace("*", ".*"), name)
        }
        if not any(n.startswith(f"{module}.weight") for names in read.values() for n in names):
            continue  # another projection's converter
        unread = sorted(n.rpartition(".")[2] for n in stored if not any(n in names for names in read.values()))
        dropped = f"; it does not read the stored {', '.join(unread)}" if unread else ""
        try:
            got = ops[0].convert(
                {src: [stored[n] for n in names] for src, names in read.items()},
                source_patterns=conv.source_patterns,
                target_patterns=conv.target_patterns,
                full_layer_name=module,
            )
        except Exception as e:  # whatever the library raises on these tensors is its reading of them
            return f"its loader fails on them ({type(e).__name__}: {str(e).strip()[:160]}){dropped}"
        weights = [v[0] for v in got.values() if isinstance(v, torch.Tensor) and v.ndim == 3]
        if len(weights) != 1:  # it read no weight (an int8 `weight` where it looks for `weight_packed`)
            return f"its loader dequantizes no weight from them, and the load fails{dropped}"
        theirs = weights[0]
        state = {n.rpartition(".")[2]: t for n, t in stored.items()}
        ours = BaseCompressor.get_value_from_registry(scheme.format).decompress(state, scheme)["weight"]
        ours = ours.to(torch.bfloat16).float()
        gap = float((theirs.float() - ours).abs().max())
        if gap > 2**-7 * float(ours.abs().max()):  # more than bf16's rounding of the largest weight
            largest = float(ours.abs().max())
            return f"the weight it dequantizes is up to {gap:.3g} off the stored one (largest {largest:.3g}){dropped}"
        return None
    return "no converter of its compressed-tensors quantizer reads these tensors"


@dataclass(frozen=True)
class DryLoad:
    """What `from_pretrained` would report loading these tensors: model keys no stored tensor fills, stored tensors
    the model has no place for, (key, stored shape, model shape) of those whose shapes differ, and the fused keys
    whose merge failed (name -> the library's reason, its last line)."""

    missing: list[str]
    unexpected: list[str]
    mismatched: list[tuple[str, list[int], list[int]]]
    conversion: dict[str, str]


def dry_load(model: Any, stored: dict[str, tuple[list[int], Any]]) -> DryLoad:
    """Load `stored` (name -> (shape, torch dtype)), as meta tensors, into `model` (built on the meta device) the way
    `from_pretrained` loads a checkpoint's tensors: transformers' renamings and per-expert merges, tied weights, the
    class's ignore patterns. Nothing is read or allocated; the model is left holding meta tensors."""
    import torch
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig
    from transformers.utils import logging as hf_logging

    state = {name: torch.empty(shape, dtype=dtype, device="meta") for name, (shape, dtype) in stored.items()}
    config = LoadStateDictConfig(weight_mapping=get_model_conversion_mapping(model), device_map={"": "meta"})
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar for a load that reads nothing
    try:
        info, _ = convert_and_load_state_dict_in_model(model, state, config)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    model.tie_weights(missing_keys=info.missing_keys, recompute_mapping=False)
    model._adjust_missing_and_unexpected_keys(info)  # noqa: SLF001 (the class's ignore patterns, as from_pretrained)
    return DryLoad(
        missing=sorted(info.missing_keys),
        unexpected=sorted(info.unexpected_keys),
        mismatched=sorted((str(k), list(a), list(b)) for k, a, b in info.mismatched_keys),
        conversion={k: str(v).strip().splitlines()[-1] for k, v in sorted(info.conversion_errors.items())},
    )


def loaded_dtypes(model: Any, stored: dict[str, tuple[list[int], Any]], dtype: Any) -> dict[str, Any]:
    """The torch dtype `from_pretrained(dtype=dtype)` holds each of `model`'s tensors in once it has loaded `stored`
    (name -> (shape, torch dtype), as dry_load takes them; `model` built on the meta device, in any dtype: it is
    cast to `dtype` first, as from_pretrained builds it in that dtype), keyed by the model's
    names: `dtype`, but where the class keeps a module in float32 (its `_keep_in_fp32_modules_strict` for bfloat16
    and float16, `_keep_in_fp32_modules` for float16), the dtype plan `from_pretrained` reads from the model's
    private `_get_dtype_plan(dtype)` and hands the loader as LoadStateDictConfig's `dtype` and `dtype_plan`. This is
    the dtype the in-memory path saves each tensor in (tests/convert/test_streaming.py holds it to a real load).
    Nothing is read or allocated; the model is left holding meta tensors."""
    import torch
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig
    from transformers.utils import logging as hf_logging

    model.to(dtype)  # built in it, as from_pretrained builds the model (the loader keeps a parameter's dtype)
    state = {name: torch.empty(shape, dtype=t, device="meta") for name, (shape, t) in stored.items()}
    config = LoadStateDictConfig(
        weight_mapping=get_model_conversion_mapping(model),
        device_map={"": "meta"},
        dtype=dtype,
        dtype_plan=model._get_dtype_plan(dtype),  # noqa: SLF001 (from_pretrained's own call, the module docstring)
    )
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        convert_and_load_state_dict_in_model(model, state, config)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return {name: t.dtype for name, t in model.state_dict().items()}


def _dtype_plan_problems() -> list[str]:
    """What no longer holds of `loaded_dtypes`' reading: the dtype plan gone or re-signed, the loader's config
    without its dtype fields."""
    from transformers import PreTrainedModel
    from transformers.modeling_utils import LoadStateDictConfig

    found = []
    plan = getattr(PreTrainedModel, "_get_dtype_plan", None)
    if not callable(plan) or list(inspect.signature(plan).parameters) != ["self", "dtype"]:
        found.append("PreTrainedModel._get_dtype_plan(self, dtype) is gone or re-signed")
    have = {f.name for f in fields(LoadStateDictConfig)}
    found += [f"LoadStateDictConfig has no `{f}`" for f in ("dtype", "dtype_plan") if f not in have]
    return found
