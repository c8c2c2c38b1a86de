"""torch's internals this project relies on (checked on 2.11-2.13).

- `Tensor._base`: the tensor a view was taken of (None for a tensor that is no view). The smoothing-mapping check
  (convert/backends/llmcompressor/mappings.py) traces which layers read a norm's output on the meta device, by
  tensor identity; a layer that reads a reshape of that output (an MoE router reads `hidden.view(-1, hidden_size)`)
  reads it through a view, followed back by `view_base`. Where the guard does not hold, `view_base` returns the
  tensor itself: a layer reading a view is then not seen as reading the norm's output (nothing more is claimed).

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on any).
"""

from __future__ import annotations

import functools
from typing import Any

from quantize.compat import outside

CHECKED = ((2, 11), (2, 14))  # [from, to): the versions the assumption above was read on


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, or a view's `_base` not the tensor it was taken of."""
    import torch

    found = [w for w in [outside("torch", torch.__version__, CHECKED)] if w]
    x = torch.zeros(2, 3, device="meta")
    if getattr(x.view(3, 2), "_base", None) is not x or getattr(x, "_base", 0) is not None:
        found.append("torch.Tensor._base no longer names the tensor a view was taken of")
    return found


def view_base(x: Any) -> Any:
    """The tensor `x` is a view of, followed through views of views; `x` itself for no view, or where `problems()`
    finds anything."""
    if _usable():
        while getattr(x, "_base", None) is not None:
            x = x._base  # noqa: SLF001 (torch's view base: module docstring)
    return x


@functools.cache
def _usable() -> bool:
    """Whether the guard holds (asked once a process: the installed torch does not change)."""
    return not problems()
