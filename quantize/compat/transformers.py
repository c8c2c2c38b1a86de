"""transformers' internals this project relies on (checked on 5.17.0).

- What `from_pretrained` does with a checkpoint's tensors before it reads a value: `core_model_loading.
  convert_and_load_state_dict_in_model(model, state_dict, load_config)` with a `modeling_utils.LoadStateDictConfig`
  carrying the model's conversion mapping (`conversion_mapping.get_model_conversion_mapping`: its renamings and
  per-expert merges) and a device map, then the model's `tie_weights(missing_keys=..., recompute_mapping=False)`
  and its private `_adjust_missing_and_unexpected_keys(loading_info)` (the class's ignore patterns), as
  `_finalize_model_loading` calls them. `dry_load` runs exactly that on a meta-device model with meta tensors of
  the headers' shapes: the missing, unexpected and mis-shaped keys and the failed merges a real load would report,
  with no weight read and nothing allocated (convert/checks.check_source).

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on any).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from importlib.metadata import version
from typing import Any

CHECKED = ((5, 17), (5, 18))  # [from, to): the versions the assumptions above were read on


def _release(v: str) -> tuple[int, int]:
    major, minor = (v.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, a function or field gone or re-signed."""
    from transformers import PreTrainedModel
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig

    found = []
    v = version("transformers")
    if not CHECKED[0] <= _release(v) < CHECKED[1]:
        found.append(f"transformers {v} is outside the checked range {CHECKED[0]}-{CHECKED[1]} (exclusive)")
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
    return found


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
