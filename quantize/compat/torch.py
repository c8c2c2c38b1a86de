"""torch's internals this project relies on (checked on 2.11-2.13).

- `Tensor._base`: the tensor a view was taken of (None for a tensor that is no view). The smoothing-mapping check
  (convert/backends/llmcompressor/mappings.py) traces which layers read a norm's output on the meta device, by
  tensor identity; a layer that reads a reshape of that output (an MoE router reads `hidden.view(-1, hidden_size)`)
  reads it through a view, followed back by `view_base`. Where the guard does not hold, `view_base` returns the
  tensor itself: a layer reading a view is then not seen as reading the norm's output (nothing more is claimed).

- `torch.fx._symbolic_trace._wrapped_fns_to_patch`: the module-level table of the namespaces `torch.fx.wrap`
  registered ((id of the namespace, function name) -> namespace), which nothing empties. `wrap_table()` returns it
  where the guard holds (None where not); compat/llmcompressor.fx_wraps_dropped says why its entries matter.

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on any).
"""

from __future__ import annotations

import functools
from typing import Any

from quantize.compat import outside

CHECKED = ((2, 11), (2, 14))  # [from, to): the versions the assumption above was read on


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, a view's `_base` not the tensor it was taken of, or the
    wrap table not the dict read here."""
    return _version_problems() + _view_problems() + _table_problems()


def _version_problems() -> list[str]:
    import torch

    return [w for w in [outside("torch", torch.__version__, CHECKED)] if w]


def _view_problems() -> list[str]:
    import torch

    x = torch.zeros(2, 3, device="meta")
    if getattr(x.view(3, 2), "_base", None) is not x or getattr(x, "_base", 0) is not None:
        return ["torch.Tensor._base no longer names the tensor a view was taken of"]
    return []


def _table_problems() -> list[str]:
    import torch.fx._symbolic_trace as symbolic_trace

    table = getattr(symbolic_trace, "_wrapped_fns_to_patch", None)
    if not isinstance(table, dict) or any(
        not (isinstance(k, tuple) and len(k) == 2 and isinstance(k[1], str)) for k in table
    ):
        return ["torch.fx._symbolic_trace._wrapped_fns_to_patch is no longer a dict keyed (namespace id, name)"]
    return []


def view_base(x: Any) -> Any:
    """The tensor `x` is a view of, followed through views of views; `x` itself for no view, or where the guard
    (the version, `_base`) does not hold."""
    if _view_usable():
        while getattr(x, "_base", None) is not None:
            x = x._base  # noqa: SLF001 (torch's view base: module docstring)
    return x


@functools.cache
def _view_usable() -> bool:
    """Whether the view guard holds (asked once a process: the installed torch does not change)."""
    return not (_version_problems() + _view_problems())


def wrap_table_problems() -> list[str]:
    """What no longer holds of `wrap_table`'s assumptions: the version, or the table's shape."""
    return _version_problems() + _table_problems()


def wrap_table() -> dict[tuple[int, str], dict[str, Any]]:
    """torch.fx's wrap table itself (module docstring); call only where `wrap_table_problems()` is empty."""
    import torch.fx._symbolic_trace as symbolic_trace

    return symbolic_trace._wrapped_fns_to_patch  # noqa: SLF001 (torch.fx's wrap table: module docstring)
