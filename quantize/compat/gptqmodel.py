"""GPTQModel's behaviour this project reads or works around (checked on gptqmodel 7.6.0 with defuser 0.0.28, what
`make gptq-env` installs).

- `defuser.model_registry.MODEL_CONFIG`: the model types whose fused projections GPTQModel's loader defuses
  (`defuser.replace_fused_blocks` / `convert_model`) before it quantizes them, one Linear per projection. It
  writes them so: Phi-3's `mlp.gate_up_proj` as `mlp.gate_proj` and `mlp.up_proj`, which transformers' own Phi-3
  does not load (measured: our reload check finds `gate_up_proj` missing and the split tensors left over). The
  gptqmodel backend refuses these model types before loading (`defused`).
- GPTQModel puts its own `"default"` RoPE initializer into transformers' `ROPE_INIT_FUNCTIONS` (transformers 5
  has none), and it calls `config.standardize_rope_params()` on every rotary embedding it builds. On Gemma 3,
  whose `rope_parameters` are one dict per layer type, that adds top-level `rope_type` and `rope_theta` keys;
  the values it computes stay right (it reads the layer type's own dict), but `save_pretrained` validates the
  config and stops on the stray keys (`AttributeError: 'str' object has no attribute 'get'`). `restore_rope`
  puts back the `rope_parameters` transformers reads from the source's config.json before saving (a conversion
  never changes them).

`problems()` lists every guarded assumption that does not hold in the installed versions
(tests/checkpoint/test_foreign.py fails on any, under `make test-gptq`, where GPTQModel is installed).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path
from typing import Any

from quantize.compat import outside

CHECKED = {"gptqmodel": ((7, 6), (7, 7)), "defuser": ((0, 0), (0, 1))}  # [from, to) of each, read on
DEFUSED_READ = ("phi3",)  # a model type the registry listed when read (the refusal's measured case)


def problems() -> list[str]:
    """What no longer holds: a version outside CHECKED, defuser's registry gone or without the model types it
    listed, or GPTQModel's RoPE initializer no longer installed in transformers' table."""
    found = [why for dist, checked in CHECKED.items() if (why := outside(dist, version(dist), checked))]
    registry = _registry()
    if not isinstance(registry, dict):
        found.append("defuser.model_registry.MODEL_CONFIG is no longer a dict of model types")
    else:
        found += [f"defuser no longer lists {t} (it defused it when read)" for t in DEFUSED_READ if t not in registry]
    import gptqmodel  # noqa: F401 (its import installs the RoPE initializer)
    from transformers import modeling_rope_utils

    init = modeling_rope_utils.ROPE_INIT_FUNCTIONS.get("default")
    if init is None or "standardize_rope_params()" not in inspect.getsource(init):
        found.append("GPTQModel's default RoPE initializer no longer calls config.standardize_rope_params()")
    return found


def _registry() -> Any:
    from defuser import model_registry

    return getattr(model_registry, "MODEL_CONFIG", None)


def defused(model_type: str) -> bool:
    """Whether GPTQModel defuses this model type's fused projections (and writes them unfused)."""
    registry = _registry()
    return isinstance(registry, dict) and model_type in registry


def restore_rope(config: Any, model_dir: Path) -> bool:
    """Put back on `config` the `rope_parameters` transformers reads from the source's config.json, where they
    differ (GPTQModel's RoPE initializer adds keys to a per-layer-type dict); True when they were changed."""
    from transformers import AutoConfig

    want = AutoConfig.from_pretrained(str(model_dir)).rope_parameters  # transformers' own reading, no remote code
    if getattr(config, "rope_parameters", None) == want:
        return False
    config.rope_parameters = want
    return True
