"""quantize.checkpoint.qdq: compressed-tensors' clamp-and-round, bit for bit, for every grid and dtype the formats
use, and a quantized checkpoint's logits unchanged by it."""

from __future__ import annotations

import pytest
from convert.test_engine import CAL, run_ok, write_recipe

torch = pytest.importorskip("torch")

from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.lifecycle import forward_helpers  # noqa: E402
from compressed_tensors.quantization.utils import calculate_range  # noqa: E402

from quantize.checkpoint import qdq  # noqa: E402

GRIDS = {  # the clamp-and-round of each format's weights or activations
    "E4M3": QuantizationArgs(num_bits=8, type="float"),
    "E2M1": QuantizationArgs(num_bits=4, type="float"),
    "int8": QuantizationArgs(num_bits=8, type="int"),
    "int4": QuantizationArgs(num_bits=4, type="int"),
}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
BITS = {2: torch.int16, 4: torch.int32}


def _values(dtype: torch.dtype) -> torch.Tensor:
    """Magnitudes from 2^-12 to 2^10 (every binade E4M3 and its subnormals meet, and past 448), the grids' ties
    (E4M3: 464 between 448 and 480, 2^-10 between 0 and 2^-9; E2M1: 5 between 4 and 6; integers: k + 1/2),
    signed zeros, infinities and NaN, in `dtype`."""
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(4096, generator=g) * torch.pow(2.0, torch.randint(-12, 11, (4096,), generator=g).float())
    special = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 448, -448, 464, -464, 480, 449, 2**-9, 2**-10]
    special += [3 * 2**-10, -(2**-10), 2**-6, 2**-7, 5.0, -5.0, 6.5, 2.5, -2.5, 0.5, 1.5, 127.5, -128.5, 7.5, -8.5]
    return torch.cat([spread, torch.tensor(special)]).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS[t.element_size()]) if t.element_size() in BITS else t.view(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("grid", list(GRIDS))
def test_rounded_is_the_librarys_clamp_and_round_bit_for_bit(grid, dtype):
    """The same bits as compressed-tensors' own function, NaN payloads, signed zeros and ties included, scaled
    as fake quantization divides: x / s for a few scales s."""
    args = GRIDS[grid]
    lo, hi = calculate_range(args, "cpu")
    for s in (1.0, 0.0177, 3.0):
        x = _values(dtype) / torch.tensor(s, dtype=dtype)
        want = qdq.library()(x, args, lo, hi)
        got = qdq.rounded(x, args, lo, hi)
        assert got.dtype == want.dtype == dtype
        assert torch.equal(_bits(got), _bits(want)), (grid, dtype, s)


def test_what_it_does_not_speed_up_is_the_librarys_own_result():
    """E4M3 kept as E4M3 (compression) and bounds per element, or not numbers of the tensor's dtype, are the
    library's own."""
    args = GRIDS["E4M3"]
    lo, hi = calculate_range(args, "cpu")
    x = _values(torch.bfloat16)
    kept = qdq.rounded(x, args, lo, hi, cast_to_original_dtype=False)
    assert kept.dtype == torch.float8_e4m3fn
    assert torch.equal(_bits(kept), _bits(qdq.library()(x, args, lo, hi, cast_to_original_dtype=False)))
    per_element = torch.full_like(x, 2.0, dtype=torch.float32)
    got = qdq.rounded(x, args, -per_element, per_element)
    assert torch.equal(_bits(got), _bits(qdq.library()(x, args, -per_element, per_element)))
    assert qdq._bound(torch.tensor(0.1), torch.bfloat16) is None  # not a bf16 number: the library clamps
    x = torch.tensor([0.3, -2.0, 500.0], requires_grad=True)  # a gradient to flow: the library's cast carries it
    rounded = qdq.rounded(x, args, lo, hi)
    rounded.sum().backward()
    assert torch.equal(rounded, qdq.library()(x, args, lo, hi)) and torch.equal(x.grad, torch.tensor([1.0, 1.0, 0.0]))


def test_installed_replaces_the_librarys_rounding_only_inside_the_block_and_restores_it():
    """The faster rounding is in place for a forward pass and gone after it, also when the block raises, nested
    blocks included; inside library_only() it is never put in place."""
    own = forward_helpers.round_to_quantized_type_args
    assert own is qdq.library() and own.__module__.startswith("compressed_tensors")
    with qdq.installed():
        assert forward_helpers.round_to_quantized_type_args is qdq.rounded
        with qdq.installed():
            assert forward_helpers.round_to_quantized_type_args is qdq.rounded
        assert forward_helpers.round_to_quantized_type_args is qdq.rounded
    assert forward_helpers.round_to_quantized_type_args is own
    with pytest.raises(KeyError), qdq.installed():
        raise KeyError("a scoring call that fails")
    assert forward_helpers.round_to_quantized_type_args is own
    with qdq.library_only(), qdq.installed():
        assert forward_helpers.round_to_quantized_type_args is own


def test_loading_a_model_leaves_compressed_tensors_as_it_is(tmp_path, tiny_model):
    """Loading changes no library function process-wide (it did, for good, before the scoped install)."""
    from quantize.checkpoint.loader import load_model

    load_model(tiny_model, dtype="float32", on="cpu")
    assert forward_helpers.round_to_quantized_type_args is qdq.library()


@pytest.mark.parametrize(
    "fields",
    [
        dict(method="rtn", scheme="FP8_BLOCK", calibration=None),  # E4M3 activations, dynamic per group of 128
        dict(method="rtn", scheme="W4AFP8", calibration=None),  # E4M3 activations, dynamic per token
        dict(method="rtn", scheme="W8A8", calibration=None),  # int8 activations, dynamic per token
        dict(method="fp8", scheme="FP8", calibration=CAL),  # E4M3 activations, static per tensor
    ],
    ids=lambda f: f["scheme"],
)
def test_a_quantized_checkpoints_logits_are_the_librarys(tmp_path, tiny_model, capsys, monkeypatch, fields):
    """Scored as the gate scores it (bf16 here, the CPU suites' dtype), a checkpoint that rounds its activations
    gives the same logits through `rounded` (which never hands a call back to the library here) as through
    compressed-tensors' own function."""
    from quantize.checkpoint.loader import LastModel

    name = fields["scheme"].lower()
    run_ok(write_recipe(tmp_path, tiny_model, name, **fields), capsys)
    model, _ = LastModel().get(tmp_path / "out" / name, dtype="bfloat16", on="cpu")
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4] * 4, [4, 11, 3, 7, 2, 9, 5, 1] * 4])
    library, calls = qdq.library(), {"fast": 0, "library": 0}

    def counting(key, fn):
        def call(*a, **k):
            calls[key] = calls.get(key, 0) + 1
            return fn(*a, **k)

        return call

    with torch.no_grad():
        monkeypatch.setattr(qdq, "library", lambda: counting("handed back", library), raising=True)
        monkeypatch.setattr(forward_helpers, "round_to_quantized_type_args", counting("fast", qdq.rounded))
        fast = model(input_ids=ids).logits
        monkeypatch.setattr(forward_helpers, "round_to_quantized_type_args", counting("library", library))
        own = model(input_ids=ids).logits
    assert calls["fast"] == calls["library"] > 0, calls  # every quantized linear rounded, both times
    assert "handed back" not in calls, calls
    assert torch.equal(fast, own)
