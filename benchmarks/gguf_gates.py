"""Gates across engines on the default model: its weights in transformers (the prepared safetensors folder, the Q4_1
GGUF dequantized to bfloat16) against GGUFs scored in llama.cpp, with gates/ci.yaml.

    aa        the same bfloat16 weights as a GGUF (llama.cpp's own quantizer, Q4_1 -> BF16: the rounding the
              prepared folder took), scored in llama.cpp: the noise floor between the engines; it must pass
    planted   that GGUF with one tensor's rows reversed inside the file (blk.0.ffn_down.weight: an engine-side
              fault, a layout read wrong): it must be rejected
    Q8_0 ...  llama.cpp's quantizer from the BF16 GGUF to each type named with --cases (time to verdict)
    Q4_K_M+imatrix ...
              the same with an importance matrix (convert/imatrix.py) from the default calibration (builtin:jargon,
              64 rows of 256 tokens), computed on the BF16 GGUF, as a gguf recipe with `calibration:` does

Each gate runs `quantize gate gates/ci.yaml --baseline FOLDER --candidate GGUF --json` (its tokens checked first),
the verdict's headline, its rules and the wall time go to benchmarks/results/gguf_gates.json (a row per case, kept
unless --redo). Needs `make model` and `make gguf-env`. Timings are of this machine; say which when citing them.

    python benchmarks/gguf_gates.py                 # aa and planted
    python benchmarks/gguf_gates.py --cases Q8_0 Q4_K_M
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "gguf_gates.json"
WORK = ROOT / "outputs" / "gguf-gates"
POLICY = ROOT / "gates" / "ci.yaml"
PLANTED_TENSOR = "blk.0.ffn_down.weight"


def requantize(src: Path, dst: Path, ftype: str) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize) from `src` to `ftype` (a LLAMA_FTYPE_MOSTLY_* name)."""
    import llama_cpp

    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    tmp = dst.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize {src} -> {ftype} failed")
    tmp.rename(dst)
    return dst


def with_matrix(src: Path, dst: Path, ftype: str) -> tuple[Path, dict]:
    """`src` quantized to `ftype` with an importance matrix from the default calibration; the matrix's record."""
    import llama_cpp

    from quantize.convert.backends.llamacpp import importance_matrix, quantize_file
    from quantize.convert.recipe import Calibration

    threads = os.cpu_count() or 1
    t0 = time.monotonic()
    matrix = importance_matrix(src, Calibration(), threads)
    seconds = round(time.monotonic() - t0, 1)
    if not dst.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(".tmp")
        quantize_file(src, tmp, getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}"), threads, True, matrix=matrix)
        tmp.rename(dst)
    record = matrix.record(src.name).model_dump() | {"seconds": seconds, "calibration": matrix.calibration.source}
    return dst, record


def planted(src: Path, dst: Path) -> Path:
    """A copy of `src` with PLANTED_TENSOR's rows in reverse order, bytes moved inside the file (the header, and
    so `quantize inspect`, cannot tell)."""
    import numpy as np

    from quantize.checkpoint import ggufs

    if dst.is_file():
        return dst
    h = ggufs.read_header(src)
    t = next(t for t in h.tensors if t.name == PLANTED_TENSOR)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    shutil.copyfile(src, tmp)
    rows = t.dims[1]
    data = np.memmap(tmp, dtype=np.uint8, mode="r+", offset=h.data_start + t.offset, shape=(rows, t.nbytes // rows))
    data[:] = data[::-1].copy()
    data.flush()
    del data
    tmp.rename(dst)
    return dst


def gate(baseline: Path, candidate: Path) -> dict:
    quantize = Path(sys.executable).parent / "quantize"
    started = time.monotonic()
    proc = subprocess.run(
        [str(quantize), "gate", str(POLICY), "--baseline", str(baseline), "--candidate", str(candidate), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = round(time.monotonic() - started, 1)
    if proc.returncode > 1:
        return {"exit": proc.returncode, "wall_s": wall, "error": proc.stderr.strip().splitlines()[-1:]}
    from quantize import records
    from quantize.records import Verdict

    v = records.loads(Verdict, proc.stdout.encode(), Path("quantize gate --json"))  # the typed record, checked
    seq = v.sequential
    return {
        "exit": proc.returncode,
        "wall_s": wall,
        "verdict": v.verdict,
        "notes": v.notes,
        "rules": {r.rule: {"verdict": r.verdict, **_headline(_evidence(r))} for r in v.rules},
        "candidate_seconds": seq.candidate_seconds if seq else None,
        "looks_taken": seq.looks_taken if seq else None,
        "items_scored": seq.items_scored if seq else None,
    }


def _evidence(rule: object) -> dict:
    """A rule result's evidence as a dict ({} for an untested rule, which has none)."""
    e = getattr(rule, "evidence", None)
    return e.model_dump() if e is not None else {}


def _headline(e: dict) -> dict:
    """A rule's evidence in a few numbers: its estimate and the bounds tested."""
    keys = ("delta", "ratio", "value", "lower_bound", "upper_bound", "n", "positions")
    return {k: round(e[k], 5) if isinstance(e[k], float) else e[k] for k in keys if k in e}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=["aa", "planted"], help="aa, planted, and llama.cpp type names")
    ap.add_argument("--redo", action="store_true")
    args = ap.parse_args()
    from quantize.checkpoint.loader import default_model_dir, find_gguf
    from quantize.machine import cpu_name

    folder = default_model_dir()
    bf16 = requantize(find_gguf(), WORK / "bf16" / "model.gguf", "BF16")
    rows = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    for case in args.cases:
        if case in rows and not args.redo:
            print(f"{case}: kept ({rows[case].get('verdict')})")
            continue
        if case == "aa":
            cand = bf16
        elif case == "planted":
            cand = planted(bf16, WORK / "planted" / "model.gguf")
        elif case.endswith("+imatrix"):
            kind = case.removesuffix("+imatrix").upper()
            cand, matrix = with_matrix(bf16, WORK / f"{kind.lower()}-imatrix" / "model.gguf", kind)
        else:
            cand = requantize(bf16, WORK / case.lower() / "model.gguf", case.upper())
        print(f"{case}: gate {cand} ...", flush=True)
        rows[case] = {"candidate": str(cand.relative_to(ROOT)), **gate(folder, cand), "cpu": cpu_name()}
        if case.endswith("+imatrix"):
            rows[case]["imatrix"] = matrix
        print(f"{case}: {rows[case].get('verdict')} in {rows[case]['wall_s']} s", flush=True)
        RESULTS.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
