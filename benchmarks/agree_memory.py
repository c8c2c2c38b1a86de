"""`quantize agree` over N outputs holds one candidate at a time: its process tree's peak RSS with N=1 and N=3
candidates (each run with a fresh, empty QUANTIZE_CACHE, so each computes the baseline's top-k and measures every
candidate; nothing is read from an earlier run's cache).

    python benchmarks/agree_memory.py --baseline MODEL --candidates A B C [--suite evaluate/core-v2.yaml]

Writes benchmarks/results/agree_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import ROOT, run_polled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--candidates", nargs="+", required=True)
    ap.add_argument("--suite", default=str(ROOT / "evaluate" / "core-v2.yaml"))
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "agree_memory.json")
    args = ap.parse_args()
    rows = []
    for n in sorted({1, len(args.candidates)}):
        with tempfile.TemporaryDirectory(prefix="agree-memory-") as cache:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "QUANTIZE_CACHE": cache}
            cmd = [sys.executable, "-m", "quantize.cli", "agree", args.suite, *args.candidates[:n]]
            t0 = time.perf_counter()
            rc, _, err, peak = run_polled([*cmd, "--baseline", args.baseline, "--quiet", "--json"], env, args.nice)
            if rc:
                raise SystemExit(f"quantize agree failed ({rc}): {err[-2000:]}")
            rows.append(
                {
                    "candidates": n,
                    "names": [Path(c).name for c in args.candidates[:n]],
                    "tree_peak_rss_mib": round(peak / 2**20, 1),
                    "wall_s": round(time.perf_counter() - t0, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    suite = Path(args.suite).resolve()
    suite = suite.relative_to(ROOT) if suite.is_relative_to(ROOT) else suite
    args.results.write_text(json.dumps({"cpu": cpu, "suite": str(suite), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
