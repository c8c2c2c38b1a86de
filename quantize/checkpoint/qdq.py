"""compressed-tensors' fake quantization on a CPU: the library's numbers, bit for bit, in less time.

A checkpoint that quantizes activations (FP8, W8A8, W4AFP8, NVFP4, MXFP4) is scored through compressed-tensors'
eager fake quantization: every quantized linear rounds its input x (…, in) in every forward,

    x̂ = Q(clamp(x / s, q_min, q_max)) · s        (Q: to the format's grid; s: the static or dynamic scale)

and `round_to_quantized_type_args` (compressed-tensors 0.19) does the clamp and Q. On a CPU two of its steps
cost more than the linear's own matmul (measured on a 2-core AMD EPYC, bf16, x of [16, 64, 1536]: the matmul
with its [1536, 576] weight ~2.3 ms):
- `torch.clamp` with q_min, q_max as 0-dim tensors takes PyTorch's tensor-bound kernel: 1.39 ms, against 0.13 ms
  with the same bounds as Python numbers;
- for E4M3, the cast back from float8_e4m3fn converts one element at a time: 2.7 ms, against 1.0 ms reading
  the same conversion from a 256-entry table (every E4M3 code cast by PyTorch itself, once).
Gated with gates/ci-bf16.yaml on this host, one after the other (benchmarks/results/gate_time_qdq_*.json), the
same verdicts and looks: FP8 static 248.0 -> 169.5 s, SmoothQuant W8A8 148.8 -> 127.3 s, FP8 block (30 of 210
linears quantized) 127.9 -> 136.0 s (within this host's noise).

`installed()` puts `rounded` in the library's place (`forward_helpers.round_to_quantized_type_args`, the one name
its quantize and quantize-dequantize paths call; quantize/compat/compressed_tensors.py guards that assumption) for
the length of a forward pass, and restores it after: nothing outside this project's own forwards sees it. Where a
bound is not a single number the tensor's dtype holds exactly, where the result stays in E4M3 (compression), or
where a gradient is to flow through it, it calls the library's own function. Where a guarded assumption no longer
holds (another compressed-tensors), nothing is replaced and a warning says so: the library's own bits, slower.
tests/checkpoint/test_qdq.py holds it to the library's bits for every type, width and dtype the formats use,
NaN, infinities, ties and subnormals included."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from collections.abc import Iterator
from typing import Any

from quantize.compat import compressed_tensors as ct

# False inside library_only(): installed() then leaves the library's own function in place (a context variable,
# so a block in one thread or task does not change another's).
_FASTER = contextvars.ContextVar("quantize_qdq_faster", default=True)


@functools.cache
def library() -> Any:
    """compressed-tensors' own round_to_quantized_type_args, read once before anything replaces it."""
    return ct.library_round()


@functools.cache
def _unusable() -> tuple[str, ...]:
    """The guarded assumptions that do not hold here (checked once per process)."""
    return tuple(ct.problems())


@functools.cache
def _e4m3_table(dtype: Any) -> Any:
    """[256] in `dtype`: entry c is PyTorch's own cast of the E4M3 code c (its bits as uint8) to `dtype`."""
    import torch

    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(dtype)


@functools.cache
def _holds(dtype: Any, v: float) -> bool:
    """Whether `dtype` holds v exactly (then clamping to it as a number or as a 0-dim tensor is the same)."""
    import torch

    return float(torch.tensor(v, dtype=dtype)) == v


def _bound(b: Any, dtype: Any) -> float | None:
    """A one-element bound as a Python number, where `dtype` holds it exactly; else None."""
    if b.numel() != 1:
        return None
    v = float(b.reshape(()))
    return v if _holds(dtype, v) else None


def rounded(tensor: Any, args: Any, min: Any, max: Any, cast_to_original_dtype: bool = True) -> Any:
    """compressed-tensors' `round_to_quantized_type_args` (same signature, same bits): `tensor` clamped to
    [min, max] and rounded to the grid of `args` (E4M3, E2M1 or integers), in the tensor's dtype."""
    import torch
    from compressed_tensors.quantization.quant_args import FP4_E2M1_DATA, FP8_E4M3_DATA, QuantizationType

    dtype = tensor.dtype
    lo, hi = (_bound(min, dtype), _bound(max, dtype)) if tensor.device.type == "cpu" else (None, None)
    fp8 = args.type == QuantizationType.FLOAT and args.num_bits == 8
    grad = torch.is_grad_enabled() and tensor.requires_grad  # the table passes no gradient; the library's cast does
    if lo is None or hi is None or (fp8 and not cast_to_original_dtype) or not dtype.is_floating_point or grad:
        return library()(tensor, args, min, max, cast_to_original_dtype)
    t = torch.clamp(tensor, lo, hi)
    if fp8:
        codes = t.to(FP8_E4M3_DATA.dtype).view(torch.uint8)
        return torch.take(_e4m3_table(dtype), codes.long())
    if args.type == QuantizationType.FLOAT and args.num_bits == 4:
        out = FP4_E2M1_DATA.cast_to_fp4(t)
    elif args.type == QuantizationType.INT:
        out = torch.round(t)
    else:
        return library()(tensor, args, min, max, cast_to_original_dtype)
    return out.to(dtype) if cast_to_original_dtype else out


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """`rounded` in compressed-tensors' place while the block runs (one forward pass), then what was there before.
    Nested blocks and library_only() leave things as they are."""
    if not _FASTER.get() or ct.library_round() is rounded:
        yield
        return
    if _unusable():
        warnings.warn(
            "quantize: compressed-tensors' fake quantization is used as it is (slower, the same bits), since "
            + "; ".join(_unusable()),
            stacklevel=3,
        )
        yield
        return
    library()  # read before the swap
    with ct.replaced(rounded):
        yield


@contextlib.contextmanager
def library_only() -> Iterator[None]:
    """compressed-tensors' own function throughout the block: installed() inside it changes nothing
    (benchmarks/gate_time.py times plain lm-eval as users run it)."""
    token = _FASTER.set(False)
    try:
        yield
    finally:
        _FASTER.reset(token)
