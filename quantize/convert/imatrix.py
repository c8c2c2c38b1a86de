"""An importance matrix for llama.cpp's quantizer, computed in llama.cpp as its llama-imatrix tool computes it, from
a recipe's calibration rows (the same sources as every recipe: convert/calibration.py, packed in the GGUF's own
tokenizer).

llama-cpp-python builds no llama-imatrix, but it exposes what the tool is made of: llama.cpp's graph callback
(`cb_eval`), called on every node the scheduler computes. Each calibration row is decoded from an empty cache in one
batch (n_ctx = n_batch = n_ubatch = seq_len, every position an output as llama-imatrix asks), its first token
replaced by the vocabulary's BOS where the vocabulary adds one (llama-imatrix's chunks). The callback takes, as
tools/imatrix/imatrix.cpp (0.3.36) does:

    MUL_MAT      a product with a layer's weight (`blk.*`; `output.weight` is left out, as llama-imatrix leaves it
                 by default) of at least 16 rows of F32 activations x: for each input column j,
                 sums[m][j] += Σ_tokens x[t, j]² and counts[m] += tokens, m the weight's matrix (0 for a 2-D weight;
                 a 3-D weight's matrices each their own)
    MUL_MAT_ID   a routed-experts product: the same, per expert e, over the tokens routed to e
                 (sums[e][j] += x[t, j]², counts[e] += 1 for each (token, chosen expert))

The quantizer weighs column j of matrix m by sums[m][j] / counts[m], and an expert no token reached by 1 for every
column (tools/quantize's load_imatrix, GGUF format); `importance` gives exactly that, flat per weight as
`llama_model_quantize_params.imatrix` takes it. The sums are float32 and added token by token in llama-imatrix's
order (a running sum, not numpy's pairwise one; experts: choice by choice, token by token), and the quotient is
float32: on the default model the matrix is bit for bit llama-imatrix's on the same GGUF and tokens, and a file
quantized with it bit for bit llama-quantize's; routed experts' entries are within 5e-8 of its (a float32
rounding apart, where not traced), their Q4_K_M file again identical (benchmarks/imatrix_reference.py). A
non-finite sum ends the run naming the weight (llama-imatrix exits there too): the source computes non-finite
activations on the calibration text.

The pure parts (`add_dense`, `add_experts`, `importance`) take numpy arrays and are tested against a loop over the
formula; `collect` runs llama.cpp (quantize/compat/llama_cpp.py reads the ggml tensors the callback is given).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quantize.compat import llama_cpp as compat
from quantize.errors import RuntimeFailure, UsageError
from quantize.io import sha256_bytes

MIN_ROWS = 16  # llama-imatrix skips products of fewer activation rows (its collect_imatrix, `ask`)
LAYER_PREFIX = "blk."  # the weights llama-imatrix collects (with process_output off, its default)


@dataclass
class Stat:
    """One weight's running sums of squared activations per input column, per matrix, and the tokens counted."""

    sums: np.ndarray  # (matrices, columns) float32, added in llama-imatrix's order
    counts: np.ndarray  # (matrices,) int64


@dataclass
class Stats:
    by_weight: dict[str, Stat] = field(default_factory=dict)

    def stat(self, name: str, matrices: int, columns: int) -> Stat:
        """The weight's Stat, made on first sight; a later product of another shape is our failure to read it."""
        s = self.by_weight.get(name)
        if s is None:
            s = self.by_weight[name] = Stat(
                np.zeros((matrices, columns), dtype=np.float32), np.zeros(matrices, dtype=np.int64)
            )
        elif s.sums.shape != (matrices, columns):
            raise RuntimeFailure(
                f"importance matrix: {name} was first seen as {s.sums.shape} (matrices, columns), now as "
                f"{(matrices, columns)}"
            )
        return s


def weight_name(name: str) -> str:
    """The weight's name as llama-imatrix keys it: the part between the first two '#' where a scheduler's copy is
    named `backend#name#n` (its filter_tensor_name), else the name itself."""
    if "#" not in name:
        return name
    return name.split("#")[1]


def add_dense(stats: Stats, name: str, x: np.ndarray, weight_ne: tuple[int, int]) -> None:
    """A MUL_MAT: x is the activations, (ne3, ne2, tokens, columns) as ggml's ne reversed; weight_ne is the weight's
    (ne2, ne3). Matrix m = (i3 mod ne3_w) * ne2_w + (i2 mod ne2_w) gets Σ_tokens x² of its slices, and its count
    grows by tokens × slices / matrices (llama-imatrix's ggml_nrows(src1) / n_mat, for every matrix)."""
    ne2_w, ne3_w = weight_ne
    matrices = ne2_w * ne3_w
    s = stats.stat(name, matrices, x.shape[-1])
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            m = (i3 % ne3_w) * ne2_w + (i2 % ne2_w)
            s.sums[m] = running_sum(s.sums[m], x[i3, i2])
    s.counts += x.shape[0] * x.shape[1] * x.shape[2] // matrices
    _finite(s, name)


def running_sum(acc: np.ndarray, x: np.ndarray) -> np.ndarray:
    """acc + x[0]² + x[1]² + ... in float32, one row after the other (each square rounded to float32, then each
    addition), as llama-imatrix's `acc[j] += x[j] * x[j]` does: the last row of a float32 cumulative sum, which
    numpy takes in order (its plain sum would add pairwise, another rounding)."""
    rows = np.concatenate([acc[None].astype(np.float32), np.square(x, dtype=np.float32)])
    return np.cumsum(rows, axis=0, dtype=np.float32)[-1]


def add_experts(stats: Stats, name: str, x: np.ndarray, ids: np.ndarray, experts: int) -> None:
    """A MUL_MAT_ID: x is (tokens, slots, columns) (slots: 1 where every chosen expert reads the same row, else
    one row per chosen expert), ids (tokens, chosen) the experts chosen per token. Each (token t, choice k) adds
    x[t, k mod slots]² to expert ids[t, k]'s sums and 1 to its count."""
    if ids.size and ((low := int(ids.min())) < 0 or (high := int(ids.max())) >= experts):
        raise RuntimeFailure(f"importance matrix: {name} routed to expert {high if low >= 0 else low} of {experts}")
    s = stats.stat(name, experts, x.shape[-1])
    for k in range(ids.shape[1]):  # llama-imatrix: choice by choice, then token by token
        for e in np.unique(ids[:, k]):
            s.sums[e] = running_sum(s.sums[e], x[ids[:, k] == e, k % x.shape[1]])
    s.counts += np.bincount(ids.ravel(), minlength=experts)
    _finite(s, name)


def _finite(s: Stat, name: str) -> None:
    if not np.isfinite(s.sums).all():
        raise UsageError(
            f"importance matrix: the source computes non-finite activations into {name} on the calibration text "
            "(llama-imatrix stops there too); check the source GGUF in llama.cpp, or quantize without `calibration:`"
        )


def importance(stats: Stats) -> dict[str, np.ndarray]:
    """What the quantizer weighs each weight's columns by, flat float32 (matrices × columns): sums / count per
    matrix in float32, 1 for a matrix no token reached."""
    out = {}
    for name, s in sorted(stats.by_weight.items()):
        counts = s.counts.astype(np.float32)[:, None]  # load_imatrix: sums[j] / (float) count
        values = np.where(counts > 0, s.sums / np.maximum(counts, np.float32(1)), np.float32(1))
        out[name] = np.ascontiguousarray(values, dtype=np.float32).ravel()
    return out


def digest(values: dict[str, np.ndarray]) -> str:
    """sha256 over each weight's name, a NUL, and its float32 values (little-endian), in name order."""
    return sha256_bytes(
        b"".join(name.encode() + b"\0" + values[name].astype("<f4").tobytes() for name in sorted(values))
    )


@dataclass
class Collected:
    values: dict[str, np.ndarray]  # importance(stats)
    counts: dict[str, np.ndarray]  # tokens counted per matrix (per expert: the tokens routed to it)
    products: int  # matrix products taken
    rows: int
    tokens: int
    bos_first: bool  # each row's first token replaced by BOS


class _Collector:
    """The graph callback: `ask` says which nodes to stop at, then each is read (a ggml tensor is only valid while
    the callback runs). An exception cannot cross back into llama.cpp: the first is kept, the rest of the graph
    computed, and `collect` raises it after the decode."""

    def __init__(self) -> None:
        self.ops = {compat.op_code(name): name for name in ("MUL_MAT", "MUL_MAT_ID")}
        self.stats = Stats()
        self.products = 0
        self.error: BaseException | None = None

    def __call__(self, address: int, ask: bool, _user: Any) -> bool:
        try:
            return self._take(address, ask)
        except BaseException as e:
            self.error = self.error or e
            return True

    def _take(self, address: int, ask: bool) -> bool:
        import llama_cpp

        t = compat.tensor(address)
        op = self.ops.get(t.op)
        if op is None or self.error is not None:
            return False
        w, x = compat.tensor(t.src[0]), compat.tensor(t.src[1])
        name = weight_name(w.name.decode(errors="replace"))
        if ask:
            if op == "MUL_MAT_ID":
                return True
            return x.ne[1] >= MIN_ROWS and x.type == llama_cpp.GGML_TYPE_F32 and name.startswith(LAYER_PREFIX)
        if x.type != llama_cpp.GGML_TYPE_F32:
            raise RuntimeFailure(f"importance matrix: the activations into {name} are ggml type {x.type}, not F32")
        xs = _array(t.src[1], x, np.float32)
        self.products += 1
        if op == "MUL_MAT":
            add_dense(self.stats, name, xs, (w.ne[2], w.ne[3]))
        else:
            ids = _array(t.src[2], compat.tensor(t.src[2]), np.int32)[0, 0]  # (tokens, chosen)
            add_experts(self.stats, name, xs[0], ids, int(w.ne[2]))
        return True


def _array(address: int, t: Any, dtype: Any) -> np.ndarray:
    """The tensor's values as (ne3, ne2, ne1, ne0), read through its byte strides from a copy of its bytes."""
    if t.nb[0] != np.dtype(dtype).itemsize:
        raise RuntimeFailure(f"importance matrix: a tensor of {np.dtype(dtype)} values has stride {t.nb[0]}")
    shape = tuple(int(n) for n in reversed(t.ne))
    strides = tuple(int(n) for n in reversed(t.nb))
    return np.ndarray(shape, dtype=dtype, buffer=compat.tensor_bytes(address), strides=strides)


def collect(
    path: Path, rows: np.ndarray, threads: int, log: Callable[[], Any], progress: Callable[[int, int], None]
) -> Collected:
    """Decode each row of token ids (rows: (samples, seq_len)) in llama.cpp on the GGUF at `path` with the
    callback above; `log` is the context that keeps llama.cpp's output (backends/llamacpp.llama_log), `progress`
    is told (rows done, rows)."""
    import llama_cpp

    if found := compat.tensor_problems():
        raise RuntimeFailure("importance matrix: " + "; ".join(found))
    n = int(rows.shape[1])
    collector = _Collector()
    callback = llama_cpp.ggml_backend_sched_eval_callback(collector)  # kept alive for the whole decode
    with log():
        model = llama_cpp.llama_model_load_from_file(os.fsencode(path), llama_cpp.llama_model_default_params())
    if not model:
        raise RuntimeFailure(f"llama.cpp could not load {path.name} to compute the importance matrix")
    ctx = batch = None
    try:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n
        params.n_threads = params.n_threads_batch = threads
        params.cb_eval = callback
        params.cb_eval_user_data = None
        with log():
            ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise RuntimeFailure(f"llama.cpp could not make a context of {n} tokens on {path.name}")
        vocab = llama_cpp.llama_model_get_vocab(model)
        bos = llama_cpp.llama_vocab_bos(vocab) if llama_cpp.llama_vocab_get_add_bos(vocab) else -1
        batch = _batch(n)
        for i, row in enumerate(rows):
            ids = row.astype(np.int32)
            if bos >= 0:
                ids[0] = bos
            ctypes.memmove(batch.token, ids.ctypes.data, ids.nbytes)
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            with log():
                rc = llama_cpp.llama_decode(ctx, batch)
            if collector.error is not None:
                raise collector.error
            if rc != 0:
                raise RuntimeFailure(f"llama.cpp's decode of calibration row {i} failed (return code {rc})")
            progress(i + 1, len(rows))
    finally:
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    if not collector.stats.by_weight:
        raise RuntimeFailure(f"importance matrix: no layer weight of {path.name} was seen in a matrix product")
    stats = collector.stats.by_weight
    counts = {name: s.counts.copy() for name, s in sorted(stats.items())}
    return Collected(importance(collector.stats), counts, collector.products, len(rows), len(rows) * n, bos >= 0)


def _batch(n: int) -> Any:
    """A batch of n tokens of sequence 0 at positions 0..n-1, every position an output: llama.cpp computes the last
    layer's rows only for the outputs asked for, and llama-imatrix asks for all (its ffn_down of the last layer
    would see one row, and go without a matrix)."""
    import llama_cpp

    batch = llama_cpp.llama_batch_init(n, 0, 1)
    batch.n_tokens = n
    for i in range(n):
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = True
    return batch


def quantize_param(values: dict[str, np.ndarray]) -> tuple[Any, list[Any]]:
    """`llama_model_quantize_params.imatrix`: an array of {name, data, size} ended by a NULL name, and what must be
    kept alive while the quantizer runs (the names, the arrays)."""
    import llama_cpp

    keep: list[Any] = []
    entries = (llama_cpp.llama_model_imatrix_data * (len(values) + 1))()
    for i, (name, v) in enumerate(sorted(values.items())):
        raw = name.encode()
        keep += [raw, v]
        entries[i].name = raw
        entries[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        entries[i].size = v.size
    entries[len(values)].name = None
    keep.append(entries)
    return entries, keep
