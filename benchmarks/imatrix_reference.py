"""Our importance matrix (quantize/convert/imatrix.py) against llama.cpp's own llama-imatrix tool, on the same GGUF
and the same tokens: every weight's entry compared.

llama-cpp-python builds no llama-imatrix; build it from the llama.cpp it vendors (its source distribution,
vendor/llama.cpp; about 8 minutes on 2 cores):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \\
        -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF && cmake --build build --target llama-imatrix -j2

then `python benchmarks/imatrix_reference.py --llama-imatrix build/bin/llama-imatrix [--cases default moe]
[--llama-quantize build/bin/llama-quantize]` (the last: llama-quantize's Q4_K_M with llama-imatrix's matrix against
ours with ours, tensor by tensor; build it with `--target llama-quantize`). Case
`default`: the default model's GGUF re-quantized to F16 (as a gguf recipe's intermediate is); case `moe`: the tiny
mixture of experts of tests/gguf_models.py (its experts' entries per expert, MUL_MAT_ID). The Jargon File
calibration split is written as text,
llama-imatrix runs over its first CHUNKS chunks of CTX tokens (its own tokenization, BOS where the vocabulary adds
one), and imatrix.collect decodes the same chunks (llama.cpp's tokenizer on the same text, cut the same way). Its
GGUF output holds Σx² per column (`NAME.in_sum2`) and the token count (`NAME.counts`); the quantizer reads their
ratio, which is what `imatrix.importance` gives. Results: benchmarks/results/imatrix_reference.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "imatrix_reference.json"
CHUNKS, CTX, THREADS = 8, 128, 2


@dataclass
class _Matrix:
    """What quantize_file reads of a matrix (backends/llamacpp.Matrix), without the calibration record."""

    collected: Any

    def metadata(self) -> dict[str, int | str]:
        return {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-imatrix", required=True, type=Path, help="a llama-imatrix binary (see above)")
    ap.add_argument("--cases", nargs="*", default=["default", "moe"], choices=["default", "moe"])
    ap.add_argument(
        "--llama-quantize", type=Path, help="a llama-quantize binary: also compare its Q4_K_M with the matrix to ours"
    )
    args = ap.parse_args()
    rows = {case: compare(args.llama_imatrix, case, args.llama_quantize) for case in args.cases}
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    print(json.dumps(rows, indent=2))
    return 0 if all(r["same_weights"] and r["worst_relative_difference"] < 1e-4 for r in rows.values()) else 1


def compare(binary: Path, case: str, llama_quantize: Path | None) -> dict:
    """llama-imatrix and imatrix.collect on one GGUF and the same chunks; their entries compared weight by weight."""
    import llama_cpp
    from gguf import GGUFReader

    from quantize.checkpoint.loader import find_gguf
    from quantize.convert import imatrix
    from quantize.convert.backends.llamacpp import quantize_file
    from quantize.machine import cpu_name
    from quantize.quiet import llama_log

    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_models import tiny_moe_gguf

    with tempfile.TemporaryDirectory(prefix="imatrix-reference-") as d:
        work = Path(d)
        f16, text, out = work / "f16.gguf", work / "jargon.txt", work / "imatrix.gguf"
        if case == "moe":
            tiny_moe_gguf(f16, find_gguf())
        else:
            quantize_file(find_gguf(), f16, llama_cpp.LLAMA_FTYPE_MOSTLY_F16, THREADS, requantize=True)
        source = resources.files("quantize") / "data" / "jargon-calibration.jsonl"
        docs = [json.loads(line)["text"] for line in source.read_text(encoding="utf-8").splitlines()]
        text.write_text("\n\n".join(docs), encoding="utf-8")

        t0 = time.perf_counter()
        subprocess.run(
            [binary, "-m", f16, "-f", text, "-c", str(CTX), "-b", str(CTX), "--chunks", str(CHUNKS)]
            + ["-o", out, "-t", str(THREADS)],
            check=True,
            capture_output=True,
        )
        theirs_s = time.perf_counter() - t0

        with llama_log():
            vocab = llama_cpp.Llama(model_path=str(f16), vocab_only=True, verbose=False)
        add_bos = llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(vocab.model))
        tokens = vocab.tokenize(text.read_bytes(), add_bos=bool(add_bos), special=False)  # as common_tokenize
        vocab.close()
        rows = np.asarray(tokens[: CHUNKS * CTX], dtype=np.int64).reshape(CHUNKS, CTX)
        t0 = time.perf_counter()
        ours = imatrix.collect(f16, rows, THREADS, llama_log, lambda _done, _n: None)
        ours_s = time.perf_counter() - t0

        same_file = None
        if llama_quantize is not None:  # their tool on their matrix, our call on ours: the same Q4_K_M?
            theirs_q, ours_q = work / "theirs-q4_k_m.gguf", work / "ours-q4_k_m.gguf"
            subprocess.run(
                [llama_quantize, "--imatrix", out, f16, theirs_q, "Q4_K_M", str(THREADS)],
                check=True,
                capture_output=True,
            )
            quantize_file(f16, ours_q, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, THREADS, False, matrix=_Matrix(ours))
            a = {t.name: t for t in GGUFReader(theirs_q).tensors}
            b = {t.name: t for t in GGUFReader(ours_q).tensors}
            same_file = {
                "tensors": len(a),
                "same_types": sum(a[n].tensor_type == b[n].tensor_type for n in a),
                "identical_tensors": sum(np.array_equal(np.asarray(a[n].data), np.asarray(b[n].data)) for n in a),
                "identical_bytes_share": sum(
                    int((np.asarray(a[n].data).view(np.uint8) == np.asarray(b[n].data).view(np.uint8)).sum()) for n in a
                )
                / sum(int(np.asarray(a[n].data).nbytes) for n in a),
            }
        reader = GGUFReader(out)
        tensors = {t.name: t for t in reader.tensors}
        theirs = {}
        for name in (n.removesuffix(".in_sum2") for n in tensors if n.endswith(".in_sum2")):
            sums = np.asarray(tensors[f"{name}.in_sum2"].data, dtype=np.float64).reshape(-1)
            counts = np.asarray(tensors[f"{name}.counts"].data, dtype=np.float64).reshape(-1)
            theirs[name] = (sums.reshape(len(counts), -1) / counts[:, None]).reshape(-1)

    same_names = sorted(theirs) == sorted(ours.values)
    rel = {n: float(np.abs(ours.values[n] - v).max() / np.abs(v).max()) for n, v in theirs.items() if n in ours.values}
    worst = max(rel, key=rel.get)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPUs ({cpu_name()})",
        "model": "tests/gguf_models.tiny_moe_gguf: 2 layers, 4 experts, 2 chosen"
        if case == "moe"
        else "SmolLM2-135M-Instruct, its Q4_1 GGUF re-quantized to F16",
        "chunks": CHUNKS,
        "ctx": CTX,
        "weights_theirs": len(theirs),
        "weights_ours": len(ours.values),
        "same_weights": same_names,
        "worst_relative_difference": rel[worst],
        "worst_weight": worst,
        "median_relative_difference": float(np.median(list(rel.values()))),
        "llama_imatrix_seconds": round(theirs_s, 2),
        "ours_seconds": round(ours_s, 2),
        "note": "relative difference: max over columns of |ours - theirs| / max |theirs|, per weight; both sum "
        "float32 running sums in llama-imatrix's order",
        "q4_k_m_llama_quantize_vs_ours": same_file,
    }


if __name__ == "__main__":
    sys.exit(main())
