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

- `compressors.pack_to_int32` and `pack_fp4_to_uint8` (public) and the pack compressors' `can_compress`: how many
  words a packed row takes and which num_bits go into int32 or uint8 words, copied without torch in
  compressed_tensors_packing.py; `problems()` packs its PACK_CASES with the library and asks the compressors.

- `quantization.lifecycle.forward.fake_quantize(x, scale, zero_point, args, global_scale=None)`: its
  quantize-dequantize with given scales and zero points, which `quantize search` applies to one layer group at a
  time to measure its damage (search/sensitivity.py, through `fake_quantize` here).

- `modeling.kvcache.QuantizedKVCache`: during calibration with a `kv_cache_scheme` it stands in for the model's
  cache in every attention call, whether or not the model passed one (none, in llm-compressor's calibration
  passes), and implements `update`; any other cache method is delegated, through its `__getattr__`, to the cache it
  wraps, and raises AttributeError where there is none. An attention that reads the cache's length before updating
  it (Llama 4's NoPE layers, whose temperature tuning counts `past_key_values.get_seq_length(layer_idx)` past
  tokens) stopped there (exit 3). `seq_length_without_a_cache()` gives the class, for the length of a block, a
  `get_seq_length` that asks the wrapped cache, or answers 0, the length transformers counts when it is given no
  cache; where the class has a `get_seq_length` of its own or no longer delegates, it leaves the class as it is.

`problems()` lists every guarded assumption that does not hold in the installed version; `replaced(fn)` swaps the
function in for a block and restores what was there, nested or not.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import version
from typing import Any

from quantize.compat import outside
from quantize.compat.compressed_tensors_packing import CONTAINERS, PACK_CASES, packable, packed_width
from quantize.compat.compressed_tensors_targets import TARGET_CASES, first_target

CHECKED = ((0, 19), (0, 20))  # [from, to): the versions the assumptions above were read on
ROUND_PARAMS = ("tensor", "args", "min", "max", "cast_to_original_dtype")
FAKE_QUANTIZE_PARAMS = ("x", "scale", "zero_point", "args", "global_scale")
PRESET_WEIGHT_GROUP = {"NVFP4": 16, "NVFP4A16": 16, "MXFP4": 32, "MXFP4A16": 32, "FP8_BLOCK": 128, "W4AFP8": 128}
# the presets among those whose weights take a global scale beside the group's (strategy tensor_group), copied
# without torch for the memory plan and checked against the library in problems()
PRESET_GLOBAL_SCALE = frozenset({"NVFP4", "NVFP4A16"})


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


def preset_global_scaled(name: str) -> bool:
    """Whether the library's preset `name` gives its weights a global scale (strategy tensor_group)."""
    from compressed_tensors.quantization import QuantizationStrategy, preset_name_to_scheme

    return preset_name_to_scheme(name, ["Linear"]).weights.strategy == QuantizationStrategy.TENSOR_GROUP


def library_packs(container: str, num_bits: int) -> bool:
    """Whether the library's compressors pack weights of `num_bits` into `container` words: pack-quantized's (int)
    into int32, both FP4 compressors' (NVFP4, MXFP4) into uint8."""
    import torch
    from compressed_tensors.compressors import (
        MXFP4PackedCompressor,
        NVFP4PackedCompressor,
        PackedQuantizationCompressor,
    )
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    def takes(compressor: Any, **args: Any) -> bool:
        try:
            scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=num_bits, **args))
        except (ValueError, NotImplementedError):  # a width the arguments themselves refuse
            return False
        return bool(compressor.can_compress(torch.nn.Linear, scheme))

    if container == "I32":
        return takes(PackedQuantizationCompressor, type="int", strategy="group", group_size=128)
    return takes(NVFP4PackedCompressor, type="float", strategy="tensor_group", group_size=16) and takes(
        MXFP4PackedCompressor, type="float", strategy="group", group_size=32
    )


def library_packed_width(container: str, cols: int, num_bits: int) -> int | None:
    """The words (int32) or bytes (uint8) the library packs a row of `cols` values of `num_bits` into; None where
    it packs no such values (pack_to_int32 raises; the FP4 compressors take another width)."""
    import torch
    from compressed_tensors.compressors import pack_fp4_to_uint8, pack_to_int32

    if container == "I32":
        try:
            return int(pack_to_int32(torch.zeros((1, cols), dtype=torch.int8), num_bits).shape[-1])
        except ValueError:
            return None
    return int(pack_fp4_to_uint8(torch.zeros((1, cols))).shape[-1]) if library_packs(container, num_bits) else None


def packing_problems() -> list[str]:
    """Where compressed_tensors_packing's copy and the library part: a num_bits one packs and the other does not,
    or a row of PACK_CASES packed into another number of words."""
    found = [
        f"compressed-tensors {'packs' if got else 'does not pack'} num_bits {b} into {c} words; "
        "compressed_tensors_packing.CONTAINERS says otherwise"
        for c in CONTAINERS
        for b in range(0, 33)
        if (got := library_packs(c, b)) != packable(c, b)
    ]
    return found + [
        f"compressed-tensors packs a row of {cols} {b}-bit values into {got} {c} words; packed_width says {want}"
        for c, cols in PACK_CASES
        for b in range(0, 10)
        if (got := library_packed_width(c, cols, b)) != (want := packed_width(cols, b, c) if packable(c, b) else None)
    ]


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, a function missing or with other parameters, a preset's
    group or global scale, the target precedence or the packing changed."""
    found = []
    if why := outside("compressed-tensors", version("compressed-tensors"), CHECKED):
        found.append(why)
    try:
        from compressed_tensors.quantization.lifecycle import forward, forward_helpers
    except ImportError as e:
        return [*found, f"compressed_tensors.quantization.lifecycle cannot be imported: {e}"]
    fq = getattr(forward, "fake_quantize", None)
    if fq is None:
        found.append("quantization.lifecycle.forward.fake_quantize is gone")
    elif (params := tuple(inspect.signature(getattr(fq, "__wrapped__", fq)).parameters)) != FAKE_QUANTIZE_PARAMS:
        found.append(f"fake_quantize takes {params}, checked on {FAKE_QUANTIZE_PARAMS}")
    found += [
        f"preset {name} groups {got} weights per scale in the library, {want} here"
        for name, want in PRESET_WEIGHT_GROUP.items()
        if (got := preset_weight_group(name)) != want
    ]
    found += [
        f"preset {name} {'takes' if name not in PRESET_GLOBAL_SCALE else 'no longer takes'} a global scale in the "
        "library, PRESET_GLOBAL_SCALE says otherwise"
        for name in PRESET_WEIGHT_GROUP
        if preset_global_scaled(name) != (name in PRESET_GLOBAL_SCALE)
    ]
    found += [
        f"compressed-tensors applies target {got!r} to {name} among {list(targets)}, first_target {want!r}"
        for name, targets in TARGET_CASES
        if (got := library_first_target(name, targets)) != (want := first_target(name, targets))
    ]
    found += packing_problems()
    from compressed_tensors.modeling.kvcache import QuantizedKVCache

    if "__getattr__" not in vars(QuantizedKVCache):
        found.append("modeling.kvcache.QuantizedKVCache no longer delegates to the cache it wraps")
    fn = getattr(forward_helpers, "round_to_quantized_type_args", None)
    if fn is None:
        return [*found, "forward_helpers.round_to_quantized_type_args is gone"]
    params = tuple(inspect.signature(getattr(fn, "__wrapped__", fn)).parameters)
    if params != ROUND_PARAMS:
        found.append(f"round_to_quantized_type_args takes {params}, checked on {ROUND_PARAMS}")
    return found


def fake_quantize(x: Any, scale: Any, zero_point: Any, args: Any) -> Any:
    """compressed-tensors' own quantize-dequantize of `x` with these scales and zero points (`args`: its
    QuantizationArgs, whose strategy says how `scale` (out, in/g) or (out, 1) is laid over `x` (out, in))."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize as library

    return library(x, scale, zero_point, args)


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


def _kv_cache_delegates() -> bool:
    """Whether QuantizedKVCache lacks a get_seq_length of its own and delegates other methods to the cache it wraps
    (the module docstring)."""
    from compressed_tensors.modeling.kvcache import QuantizedKVCache

    return "get_seq_length" not in vars(QuantizedKVCache) and "__getattr__" in vars(QuantizedKVCache)


@contextlib.contextmanager
def seq_length_without_a_cache() -> Iterator[None]:
    """QuantizedKVCache.get_seq_length while the block runs: the wrapped cache's, or 0 where it wraps none (the
    module docstring); the class as it was after, however the block ends."""
    from compressed_tensors.modeling.kvcache import QuantizedKVCache

    if not _kv_cache_delegates():
        yield
        return

    def get_seq_length(self: Any, layer_idx: int = 0) -> int:
        wrapped = self.__dict__.get("past_key_values")
        cache = wrapped() if wrapped is not None else None
        return 0 if cache is None else cache.get_seq_length(layer_idx)

    QuantizedKVCache.get_seq_length = get_seq_length
    try:
        yield
    finally:
        del QuantizedKVCache.get_seq_length
