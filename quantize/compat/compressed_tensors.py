"""compressed-tensors' internals this project relies on (checked on 0.19.0).

- `quantization.lifecycle.forward_helpers.round_to_quantized_type_args(tensor, args, min, max,
  cast_to_original_dtype=True)`: the one clamp-and-round that its quantize and quantize-dequantize paths look up on
  the module at call time, so replacing the module attribute reroutes both (checkpoint/qdq.py puts a faster one
  with the same bits there for the length of a forward pass).

- `PRESET_WEIGHT_GROUP`: the weights per scale along the input axis of the presets whose layout the format fixes
  (a block's side for FP8_BLOCK), as `preset_name_to_scheme(name, ...)` builds them. Copied here because a
  recipe is validated before torch (which compressed-tensors imports) loads; `problems()` compares every entry
  with the library, so a preset that changes upstream fails tests/compat rather than planning other layers.

- `utils.match.match_name` and `match_targets` (public): copied without torch in compressed_tensors_targets.py
  (its docstring says why); `problems()` compares the copy with the library on its TARGET_CASES.

`problems()` lists every guarded assumption that does not hold in the installed version; `replaced(fn)` swaps the
function in for a block and restores what was there, nested or not.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import version
from typing import Any

from quantize.compat.compressed_tensors_targets import TARGET_CASES, first_target

CHECKED = ((0, 19), (0, 20))  # [from, to): the versions the assumptions above were read on
ROUND_PARAMS = ("tensor", "args", "min", "max", "cast_to_original_dtype")
PRESET_WEIGHT_GROUP = {"NVFP4": 16, "NVFP4A16": 16, "MXFP4": 32, "MXFP4A16": 32, "FP8_BLOCK": 128, "W4AFP8": 128}


def library_first_target(name: str, targets: Iterable[str]) -> str | None:
    """The same answer from the library itself (imports torch), on a module of no quantizable class."""
    import torch
    from compressed_tensors.utils.match import match_targets

    return next(iter(match_targets(name, torch.nn.Module(), list(targets))), None)


def preset_weight_group(name: str) -> int | None:
    """The library's own weights per scale (input axis) of preset `name`; None where it has no fixed group."""
    from compressed_tensors.quantization import preset_name_to_scheme

    w = preset_name_to_scheme(name, ["Linear"]).weights
    if w.block_structure:
        return int(w.block_structure[1])
    return int(w.group_size) if w.group_size else None


def _release(v: str) -> tuple[int, int]:
    major, minor = (v.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, the function missing or with other parameters."""
    found = []
    v = version("compressed-tensors")
    if not CHECKED[0] <= _release(v) < CHECKED[1]:
        found.append(f"compressed-tensors {v} is outside the checked range {CHECKED[0]}-{CHECKED[1]} (exclusive)")
    try:
        from compressed_tensors.quantization.lifecycle import forward_helpers
    except ImportError as e:
        return [*found, f"compressed_tensors.quantization.lifecycle.forward_helpers cannot be imported: {e}"]
    found += [
        f"preset {name} groups {got} weights per scale in the library, {want} here"
        for name, want in PRESET_WEIGHT_GROUP.items()
        if (got := preset_weight_group(name)) != want
    ]
    found += [
        f"compressed-tensors applies target {got!r} to {name} among {list(targets)}, first_target {want!r}"
        for name, targets in TARGET_CASES
        if (got := library_first_target(name, targets)) != (want := first_target(name, targets))
    ]
    fn = getattr(forward_helpers, "round_to_quantized_type_args", None)
    if fn is None:
        return [*found, "forward_helpers.round_to_quantized_type_args is gone"]
    params = tuple(inspect.signature(getattr(fn, "__wrapped__", fn)).parameters)
    if params != ROUND_PARAMS:
        found.append(f"round_to_quantized_type_args takes {params}, checked on {ROUND_PARAMS}")
    return found


def library_round() -> Callable[..., Any]:
    """The function compressed-tensors' fake quantization calls now."""
    from compressed_tensors.quantization.lifecycle import forward_helpers

    return forward_helpers.round_to_quantized_type_args


@contextlib.contextmanager
def replaced(fn: Callable[..., Any]) -> Iterator[None]:
    """`fn` in place of `round_to_quantized_type_args` while the block runs; what was there before is restored
    after, however the block ends."""
    from compressed_tensors.quantization.lifecycle import forward_helpers

    before = forward_helpers.round_to_quantized_type_args
    forward_helpers.round_to_quantized_type_args = fn
    try:
        yield
    finally:
        forward_helpers.round_to_quantized_type_args = before
