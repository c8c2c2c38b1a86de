"""llm-compressor's internals this project relies on (checked on 0.14.0.1).

- `llmcompressor.entrypoints.model_free` imports safetensors' `save_file` into its own namespace and writes every
  output shard through that name; `model_free_ptq_pt` replaces it for one call with `save_file(...,
  metadata={"format": "pt"})`, the header save_pretrained writes, so a streamed shard is byte-identical to the
  in-memory path's (tests/convert/test_streaming.py).
- `oneshot` replaces every fused experts module (`llmcompressor.modeling.moe.linearize.get_non_linearized_moes`) by
  `LinearExperts2D.get_linear_experts_cls(type(experts))(config)` (`linearize_moe`, which then copies the weights)
  before its modifiers resolve their mappings; `meta_linearized` builds that same layout on the meta device without
  the copy, so AWQ's and SmoothQuant's mappings are resolved on the module names the run will have
  (quantize/convert/backends/mappings.py).

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on any).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path
from typing import Any

CHECKED = ((0, 14), (0, 15))  # [from, to): the versions the assumption above was read on
PT = {"format": "pt"}  # the __metadata__ transformers' save_pretrained writes in each safetensors header


def _release(v: str) -> tuple[int, int]:
    major, minor = (v.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, the module without its own `save_file`, or
    model_free_ptq without the parameters called here."""
    import llmcompressor.entrypoints.model_free as model_free

    found = []
    v = version("llmcompressor")
    if not CHECKED[0] <= _release(v) < CHECKED[1]:
        found.append(f"llmcompressor {v} is outside the checked range {CHECKED[0]}-{CHECKED[1]} (exclusive)")
    if not callable(getattr(model_free, "save_file", None)):
        found.append("llmcompressor.entrypoints.model_free no longer writes its shards through its own save_file")
    params = inspect.signature(model_free.model_free_ptq).parameters
    found += [f"model_free_ptq takes no `{p}`" for p in ("config", "max_workers") if p not in params]
    return found + _linearize_problems()


def _linearize_problems() -> list[str]:
    from llmcompressor.entrypoints.oneshot import Oneshot
    from llmcompressor.modeling.moe import linear_experts, linearize

    found = []
    if not callable(getattr(linearize, "get_non_linearized_moes", None)):
        found.append("llmcompressor.modeling.moe.linearize has no get_non_linearized_moes")
    if not callable(getattr(linear_experts.LinearExperts2D, "get_linear_experts_cls", None)):
        found.append("LinearExperts2D has no get_linear_experts_cls")
    if "cls(config)" not in inspect.getsource(linear_experts.LinearExperts2D.from_experts_module):
        found.append("LinearExperts2D.from_experts_module no longer builds its layout as cls(config)")
    if "linearize_moe(self.model)" not in inspect.getsource(Oneshot.apply_recipe_modifiers):
        found.append("oneshot no longer linearizes fused experts before its modifiers resolve their mappings")
    return found


def meta_linearized(model: Any) -> Any:
    """`model` (on the meta device) with each fused experts module replaced by llm-compressor's linear experts
    layout, as `oneshot` replaces it before resolving mappings, built on the meta device (no weight copied).
    Raises what the library raises for a family it cannot linearize."""
    import torch
    from llmcompressor.modeling.moe.linear_experts import LinearExperts2D
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes

    for name, experts in get_non_linearized_moes(model):
        config = getattr(experts, "config", model.config)
        with torch.device("meta"):
            model.set_submodule(name, LinearExperts2D.get_linear_experts_cls(type(experts))(config))
    return model


def model_free_ptq_pt(model_dir: Path, folder: Path, config: Any) -> None:
    """llm-compressor's `model_free_ptq(model_dir, folder, config=config, max_workers=1)`, every shard written with
    save_pretrained's header metadata ({"format": "pt"})."""
    from functools import partial
    from unittest import mock

    import llmcompressor.entrypoints.model_free as model_free
    from safetensors.torch import save_file

    with mock.patch.object(model_free, "save_file", partial(save_file, metadata=PT)):
        model_free.model_free_ptq(str(model_dir), str(folder), config=config, max_workers=1)
