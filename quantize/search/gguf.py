"""`quantize search` with a `method: gguf` base: llama.cpp's tensor types chosen per layer group under a byte budget,
each allocation written by llama.cpp's own quantizer and measured in llama.cpp.

    base: {method: gguf, type: Q4_K_M}   # the file type: what every tensor outside the layer groups gets
    options: [Q4_K, Q6_K, Q8_0, keep]     # ggml tensor types per layer group; keep: the 16-bit source's

- The 16-bit GGUF everything is quantized from: the source's own where it holds no block-quantized tensor, else
  re-quantized to F16 once (as a gguf recipe's intermediate); a safetensors source is written by llama.cpp's
  converter (convert/hf_to_gguf.py). It lives in a scratch folder beside the output, removed at the end.
- Layer groups: the GGUF's 2-D weights of each block (`blk.N.`), by the part their name begins with (`attn_`,
  `ffn_`, `ssm_`, ...: the gguf package's tensor names) with `unit: block-part`, or each weight with `unit: layer`.
- Bytes per option are measured, never computed: the 16-bit GGUF is quantized once per option at the base file type
  with every grouped weight given that type (tensor_types), and each weight's bytes read from the written header, so
  llama.cpp's own fallbacks (a row that holds no whole block takes a type of smaller blocks) are counted as it
  writes them. Every other tensor (embeddings, the output, norms) is fixed at what the base file type gives it.
- An importance matrix, where the base has a `calibration:`: computed once on the 16-bit GGUF from those rows (as a
  gguf recipe computes its own: backends/llamacpp.importance_matrix), and every file below quantized with it, so
  the damage measured is the damage of what the tries write (each try, a gguf recipe with the same calibration,
  computes the same matrix on the same 16-bit GGUF).
- Sensitivity: for each group and option, a GGUF with that group alone at the option (every other weight named at
  its 16-bit type: llama.cpp applies tensor_types only in a quantized file type),
  its mean KL to the 16-bit GGUF on the sensitivity items, both in llama.cpp (evaluate/agreement.LlamaCppScorer,
  the scorer `quantize agree` uses on a GGUF). Held-out allocations are written and measured the same way.
- Tries are gguf recipes whose `tensor_types` give every grouped weight its allocation's type (one pattern per
  type and weight name, its blocks alternated), converted and gated as any search's tries.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantize.checkpoint import ggufs
from quantize.convert.backends.llamacpp import LlamaCppBackend, Matrix, quantize_file, tensor_types
from quantize.convert.gguf import default_tensor_type, exact_patterns, ftype_names
from quantize.convert.recipe import GGUFRecipe
from quantize.errors import UsageError
from quantize.search.units import Layout, Linear, Unit

BLOCK = re.compile(r"^blk\.(\d+)\.([a-z0-9]+)_")  # a block's weight: its index and the part its name begins with
KEEP = "keep"


def check_options(options: list[str]) -> None:
    """Every option a tensor type the installed llama.cpp writes (UsageError naming the ones it does not)."""
    import llama_cpp

    known = tensor_types(ftype_names(llama_cpp))
    if bad := [o for o in options if o != KEEP and o not in known]:
        raise UsageError(
            f"options: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} no tensor type llama.cpp writes in a "
            f"file; choose among {', '.join(known)} (or keep)"
        )


def source(spec: Any) -> Path:
    """The search's model as a gguf recipe reads it (backends/llamacpp.LlamaCppBackend.source: a GGUF, the default
    model's, or a safetensors checkpoint), checked before anything is quantized."""
    base: GGUFRecipe = spec.base
    return LlamaCppBackend.source(base.model_copy(update={"model": spec.model}))


def bits_of(option: str) -> float:
    """Bits per weight of a ggml type's blocks (the gguf package's block layout); keep: 16."""
    import gguf

    if option == KEEP:
        return 16.0
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[option]]
    return 8 * size / block


def unit_name(tensor: str, unit: str) -> str | None:
    """The layer group a tensor belongs to (None: outside every group)."""
    if not (m := BLOCK.match(tensor)):
        return None
    return tensor.removesuffix(".weight") if unit == "layer" else f"blk.{m.group(1)}.{m.group(2)}"


@contextmanager
def workspace(out: Path) -> Iterator[Path]:
    """The scratch folder beside the search's output, removed when the search ends however it ends."""
    folder = out.parent / f".{out.name}.gguf-search"
    if folder.is_symlink() or folder.exists():
        raise UsageError(f"{folder} exists (a search killed before it cleaned up); remove it and run again")
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Files:
    """The layer groups of the 16-bit GGUF's weights (`groups`: group -> its tensors, unit_name's), and GGUFs of
    allocations over them, written by llama.cpp's quantizer into the scratch folder (with `matrix`, the search's
    importance matrix, where it has one): one at a time, each named anew (the scorer's memo is keyed by path)."""

    def __init__(
        self, f16: Path, scratch: Path, threads: int, base_type: str, unit: str, matrix: Matrix | None = None
    ) -> None:
        import llama_cpp

        self.f16, self.scratch, self.threads, self.matrix = f16, scratch, threads, matrix
        self.ftypes = ftype_names(llama_cpp)
        self.base_type = base_type
        tensors = ggufs.read_header(f16).tensors
        self.groups: dict[str, list[ggufs.GGUFTensor]] = {}
        for t in tensors:
            if len(t.dims) >= 2 and (u := unit_name(t.name, unit)) is not None:
                self.groups.setdefault(u, []).append(t)
        if not self.groups:
            raise UsageError(f"{f16.name} holds no block weights (blk.N.*) to choose types for")
        self.keep = {t.name: t.ggml_type for t in tensors}  # each tensor's 16-bit type
        self.weights = [t.name for t in tensors if len(t.dims) >= 2 and t.name.endswith(".weight")]
        self.n = 0

    def write(self, alloc: dict[str, str], alone: bool = False) -> Path:
        """A GGUF with each group of `alloc` at its option (keep: the 16-bit type), every other tensor as the base
        file type gives it, or with `alone` at its 16-bit type (llama.cpp applies tensor_types only in a quantized
        file type, so the rest is kept 16-bit by naming each weight)."""
        self.n += 1
        out = self.scratch / f"alloc-{self.n}.gguf"
        types = dict.fromkeys(self.weights, None) if alone else {}
        types |= {t.name: (self.keep[t.name] if o == KEEP else o) for u, o in alloc.items() for t in self.groups[u]}
        types = {n: t or self.keep[n] for n, t in types.items()}
        ftype = self.ftypes[self.base_type]
        quantize_file(
            self.f16, out, ftype, self.threads, requantize=False, matrix=self.matrix, overrides=exact_patterns(types)
        )
        return out


def layout(files: Files, options: list[str]) -> Layout:
    """The groups and their bytes per option, measured in files llama.cpp writes (the module's docstring)."""
    per: dict[str, dict[str, int]] = {}
    for o in options:
        written = files.write(dict.fromkeys(files.groups, o))
        per[o] = {t.name: t.nbytes for t in ggufs.read_header(written).tensors}
        written.unlink()
    grouped = {t.name for ts in files.groups.values() for t in ts}
    fixed = sum(b for n, b in per[options[0]].items() if n not in grouped)  # the same in every option's file
    units = [
        Unit(
            u,
            [Linear(t.name, t.dims[1], t.dims[0], t.nbytes, None) for t in ts],
            {o: sum(per[o][t.name] for t in ts) for o in options},
        )
        for u, ts in files.groups.items()
    ]
    return Layout(units, fixed, sum(t.elements for t in ggufs.read_header(files.f16).tensors))


def try_recipe(
    spec: Any, source_path: Path, alloc: dict[str, str], lay: Layout, keep: dict[str, str], out: Path
) -> dict:
    """A gguf recipe giving each grouped weight its allocation's type: one tensor_types pattern per type and
    weight name (the part after blk.N.), its blocks alternated; keep is the 16-bit GGUF's type (`keep`)."""
    by: dict[tuple[str, str], list[str]] = {}
    for u in lay.units:
        for lin in u.linears:
            m = BLOCK.match(lin.name)
            assert m is not None
            kind = keep[lin.name] if alloc[u.name] == KEEP else alloc[u.name]
            by.setdefault((kind, lin.name[m.end(1) + 1 :]), []).append(m.group(1))
    patterns = {
        rf"^blk\.({'|'.join(sorted(set(b), key=int))})\.{re.escape(rest)}$": kind for (kind, rest), b in by.items()
    }
    base = spec.base.model_dump(mode="json", exclude={"name", "output", "model", "tensor_types", "description"})
    return {"name": spec.name, "model": str(source_path), "output": str(out), **base, "tensor_types": patterns}


def base_option(base: GGUFRecipe) -> str:
    """The option the base file type gives its tensors (Q4_K_M: Q4_K)."""
    return default_tensor_type(base.type)
