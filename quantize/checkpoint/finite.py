"""What a checkpoint's weights store: the tensors holding NaN or ±infinity, for either kind of checkpoint.

A gate's verdict comes only from finite numbers, and a checkpoint's scores can be finite while its weights are not:
an embedding row of a token no golden item holds is never read, a NaN scale of an unused expert is never
multiplied, llama.cpp rounds an activation to 8 bits before a Q8_0 matrix (a NaN element becomes finite). So the
weights themselves are scanned, and what is found rides in a score's provenance (evaluate/score.checkpoint_ref:
CheckpointRef.non_finite_tensors), where a gate makes every rule on it a regression and refuses it as a baseline.

`non_finite_tensors` is the one function the stages call: a GGUF's tensors are dequantized by the gguf package
(ggufs.non_finite_tensors); a safetensors checkpoint's files, exactly those its identity covers (files.weight_paths:
what a load reads), are read here, every floating tensor a chunk of SCAN_ELEMENTS elements at a time, so memory does
not grow with the tensor. Each stored dtype is read as the torch dtype safetensors loads it as (FLOAT_DTYPES: F64,
F32, F16, BF16, the float8 ones; C64 too), an 8-bit one widened to float32 first (torch computes no isfinite of
float8_e4m3fn, and widening is exact): float8 E4M3 stores NaN only, E5M2 infinity and NaN, E8M0 (an MX block's
scale) NaN only. Integer and packed tensors (I*, U*, BOOL, a packed int4 weight) hold no NaN, and F4 and the F6
dtypes (E2M1, E2M3, E3M2) encode no non-finite value, so none of them is read; a quantized layer's NaN scale is a
floating tensor, and is found. Each file's result is memoized as a GGUF's is (in the process, and in the identity
memo on disk under the file's stat key and this machine's boot id), so a scoring run, a gate and a report read a
file once per boot; a file rewritten is read again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantize import progress
from quantize.checkpoint import files, ggufs
from quantize.checkpoint.headers import FLOATS, TORCH_NAMES, read_header
from quantize.errors import UsageError
from quantize.io import open_user_file

# elements read at a time (16 MiB as float32, 32 MiB as float64), whatever the tensor's size
SCAN_ELEMENTS = 1 << 22
# 1 (2026-12-08): every tensor of FLOAT_DTYPES; kept in the identity memo under it
SAFETENSORS_SCAN_VERSION = 1
# safetensors' stored dtype -> the torch dtype it loads it as (its attribute name), for each one that can store a
# non-finite value: headers.TORCH_NAMES' floating ones, and the two it does not list (held to what safetensors
# writes for each by tests/checkpoint/test_finite.py)
FLOAT_DTYPES = {
    **FLOATS,
    **{k: v for k, v in TORCH_NAMES.items() if k.startswith("F8_")},
    "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
}
MAX_WEIGHT_BYTES = 2**50  # no cap a weight file meets: open_user_file's checks are what is wanted (a regular file)


def non_finite_tensors(checkpoint: str | Path) -> list[str]:
    """The names of the tensors of a checkpoint (a GGUF, or safetensors files) whose stored values are not all
    finite, in name order; [] where every value is finite. A GGUF through ggufs.non_finite_tensors; a safetensors
    checkpoint's every weight file its identity covers (files.weight_paths), each memoized under its stat key."""
    if ggufs.find(checkpoint) is not None:
        return ggufs.non_finite_tensors(checkpoint)
    return sorted(
        name
        for f in files.weight_paths(Path(checkpoint))
        for name in ggufs.kept_scan(f, "safetensors", SAFETENSORS_SCAN_VERSION, _scan)
    )


def _scan(path: Path) -> tuple[str, ...]:
    """The floating tensors of one safetensors file whose values are not all finite, read in file order (its
    progress: ggufs.scan_stage)."""
    import torch

    tensors, _, _ = read_header(path)
    scanned = sorted((t for t in tensors.values() if t.dtype in FLOAT_DTYPES and t.nbytes), key=lambda t: t.offset)
    fix = "re-save or re-download the checkpoint"
    buf = bytearray(SCAN_ELEMENTS * 8)  # the widest element: 8 bytes
    with (
        open_user_file(path, "safetensors file", MAX_WEIGHT_BYTES, hint=fix) as fh,
        ggufs.scan_stage(path, path.stat().st_size, len(scanned)) as st,
    ):
        found = []
        for t in progress.counted(st, scanned):
            if not _finite(torch, path, fh, buf, t.offset, t.nbytes, getattr(torch, FLOAT_DTYPES[t.dtype])):
                found.append(t.name)
        return tuple(found)


def _finite(torch: Any, path: Path, fh: Any, buf: bytearray, start: int, nbytes: int, dtype: Any) -> bool:
    """Whether every value of `nbytes` bytes at `start` of the open file, read as `dtype`, is finite; read
    SCAN_ELEMENTS at a time into `buf`."""
    step = SCAN_ELEMENTS * dtype.itemsize
    fh.seek(start)
    for done in range(0, nbytes, step):
        n = min(step, nbytes - done)
        if fh.readinto(memoryview(buf)[:n]) != n:
            raise UsageError(f"{path} changed while it was read (a tensor's bytes end early); read it again")
        values = torch.frombuffer(buf, dtype=torch.uint8, count=n).view(dtype)
        if not bool(torch.isfinite(values.float() if dtype.itemsize == 1 else values).all()):
            return False
    return True
