"""Per-request score differences that come from which SIMD kernels the math libraries pick, at one thread count: the
same checkpoint and requests scored in a fresh process per variant, each variant capping one library's instruction
set through its own environment variable, as another CPU that reports the same masked model name ("AMD EPYC",
"Intel(R) Xeon(R) Processor") but lacks some extensions would run.

    python benchmarks/isa_variance.py [CHECKPOINT ...] [--threads 2] [--items 24] [--json OUT]

Variants: this CPU as it is, twice (a run must reproduce itself exactly, or nothing else here means anything);
MKL's kernels capped at AVX (MKL_ENABLE_INSTRUCTIONS, the float32 matmuls' BLAS); torch's own vectorized kernels at
their default level (ATEN_CPU_CAPABILITY); oneDNN capped at SSE4.1 (ONEDNN_MAX_CPU_ISA). Requests as in
benchmarks/thread_variance.py (tests/evaluate/test_lm.py's `items`, seeded: nothing read from the golden set or the
score cache), scored by quantize's own lm-eval model with qdq installed, one request a pass where activations are
quantized, as `eval` runs them. Per checkpoint and variant against the first native run: the largest
|Δ log-likelihood|, the requests that differ at all and past 1e-4 nats, and is_greedy flips.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from quantize.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "outputs" / "fp8-e4m3", ROOT / "outputs" / "references" / "rtn-w8a16-g128"]
TOL = 1e-4  # nats per request: the scorer's equality tolerance (tests/evaluate/test_lm.py TOL)
VARIANTS = {
    "native": {},
    "native again": {},
    "MKL at AVX": {"MKL_ENABLE_INSTRUCTIONS": "AVX"},
    "torch kernels at default": {"ATEN_CPU_CAPABILITY": "default"},
    "oneDNN at SSE4.1": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def worker(path: Path, threads: int, n_items: int, out: Path) -> None:
    """Score the requests once under this process's environment and write their log-likelihoods and greedy flags."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "evaluate")]
    import torch
    from test_lm import items, ours

    from quantize.checkpoint import qdq
    from quantize.checkpoint.loader import load_model

    loaded = load_model(path, dtype=torch.float32)
    reqs = items(loaded, n_items, seed=3)
    torch.set_num_threads(threads)
    started = time.monotonic()
    with qdq.installed():
        got = ours(loaded, batch_size=16, max_length=256).loglikelihood(reqs, disable_tqdm=True)
    out.write_text(
        json.dumps(
            {
                "lls": [ll for ll, _ in got],
                "greedy": [bool(g) for _, g in got],
                "seconds": round(time.monotonic() - started, 1),
                "capability": torch.backends.cpu.get_cpu_capability(),
            }
        )
    )


def measure(path: Path, threads: int, n_items: int, work: Path) -> dict:
    runs = {}
    for name, env in VARIANTS.items():
        out = work / f"{path.name}-{len(runs)}.json"
        cmd = [sys.executable, __file__, "--worker", str(path), "--threads", str(threads), "--items", str(n_items),
               "--json", str(out)]  # fmt: skip
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads), **env})
        runs[name] = json.loads(out.read_text())
    first = runs["native"]
    name = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    row: dict = {"checkpoint": name, "requests": len(first["lls"]), "threads": threads}
    for variant, r in runs.items():
        if variant == "native":
            continue
        d = [abs(a - b) for a, b in zip(first["lls"], r["lls"], strict=True)]
        row[variant] = {
            "env": VARIANTS[variant],
            "torch_capability": r["capability"],
            "max_abs_dll": max(d),
            "requests_differing": sum(x > 0 for x in d),
            "requests_past_1e-4": sum(x > TOL for x in d),
            "is_greedy_flips": sum(a != b for a, b in zip(first["greedy"], r["greedy"], strict=True)),
            "seconds": r["seconds"],
        }
    row["native_seconds"] = first["seconds"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--items", type=int, default=24, help="multiple-choice items (4 requests each)")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "isa_variance.json")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.threads, args.items, args.json)
    if missing := [str(p) for p in args.checkpoints if not (p / "config.json").is_file()]:
        sys.exit(f"not a checkpoint folder: {', '.join(missing)} (the defaults are `make demo`'s outputs)")
    work = args.json.parent / "isa-variance-work"
    work.mkdir(parents=True, exist_ok=True)
    rows = [measure(p, args.threads, args.items, work) for p in args.checkpoints]
    for f in work.iterdir():
        f.unlink()
    work.rmdir()
    for r in rows:
        print(r["checkpoint"], r["requests"], "requests at", r["threads"], "threads:")
        for k, v in r.items():
            if isinstance(v, dict):
                print(f"  {k}: max |dll| {v['max_abs_dll']:.3g}, {v['requests_past_1e-4']} past 1e-4, "
                      f"{v['is_greedy_flips']} greedy flips")  # fmt: skip
    flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": cpu_name(),
        "simd_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse"))),
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
