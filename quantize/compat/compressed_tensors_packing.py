"""How compressed-tensors packs a quantized weight into words, copied without torch (checked on 0.19.0 by
compressed_tensors.problems()).

- `pack-quantized` (int weights): `compressors.pack_quantized.helpers.pack_to_int32(value, num_bits)` (public)
  packs values of 1 to 8 bits densely into int32 words along the last axis, no bit left between values and a value
  split across two words where it must be: a row of `cols` values takes ceil(cols × num_bits / 32) words, and any
  other num_bits is a ValueError (its compressor's `can_compress` takes 1 to 8 too). The compressor stores the
  weight's own shape beside the words, as `weight_shape` (int64).
- `nvfp4-pack-quantized` and `mxfp4-pack-quantized` (FP4 E2M1 weights): `compressors.nvfp4.helpers.pack_fp4_to_uint8`
  packs two 4-bit values a byte, a row of `cols` values in cols / 2 bytes; their compressors take num_bits 4 only.
  No `weight_shape` is stored.

`packed_width` is that rule for a row's length alone: the accounting reads headers, where importing the library
imports torch (compressed_tensors_targets.py says why that is too slow there). compressed_tensors.problems() packs
PACK_CASES with the library itself and asks its compressors which num_bits they take, so a change upstream fails
tests/compat.
"""

from __future__ import annotations

# safetensors dtype of the words -> (bits a word, the num_bits compressed-tensors packs into it, the function that
# does, what a word is called)
CONTAINERS: dict[str, tuple[int, tuple[int, ...], str, str]] = {
    "I32": (32, tuple(range(1, 9)), "pack_to_int32", "int32 words"),
    "U8": (8, (4,), "pack_fp4_to_uint8", "uint8 bytes"),
}
# (container, row length) packed by problems() at every num_bits from 0 to 9 with the library, against packed_width
PACK_CASES = (("I32", 1), ("I32", 7), ("I32", 32), ("I32", 100), ("I32", 128), ("U8", 2), ("U8", 16), ("U8", 96))


def packable(container: str, num_bits: int) -> bool:
    """Whether compressed-tensors packs values of `num_bits` into words of safetensors dtype `container`."""
    return container in CONTAINERS and num_bits in CONTAINERS[container][1]


def packed_width(cols: int, num_bits: int, container: str) -> int:
    """Words (int32) or bytes (uint8) compressed-tensors packs a row of `cols` values of `num_bits` into."""
    return -(-cols * num_bits // CONTAINERS[container][0])


def fitting_bits(cols_low: int, cols_high: int, words: int, container: str) -> list[int]:
    """The num_bits at which some row length from `cols_low` to `cols_high` packs into `words`."""
    return [
        b
        for b in CONTAINERS[container][1]
        if packed_width(cols_low, b, container) <= words <= packed_width(cols_high, b, container)
    ]
