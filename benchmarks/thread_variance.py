"""Per-request score differences that come from torch's CPU thread count, not from the checkpoint: each checkpoint
scored by quantize's own lm-eval model (PrefixLM, one request a pass where activations are quantized, as `eval`
runs it; qdq installed as score.run_lm_eval installs it) under each thread count, the same requests every time.

    python benchmarks/thread_variance.py [CHECKPOINT ...] [--threads 2 1] [--items 24] [--json OUT]

Default checkpoints: `make demo`'s FP8 dynamic and 8-bit RTN reference outputs. Requests: tests/evaluate/test_lm.py's
`items` (multiple-choice continuations of random words in the checkpoint's own vocabulary, seeded), so nothing is
read from the golden set and nothing from the score cache. Per checkpoint and pair of thread counts: the largest
|Δ log-likelihood|, how many requests differ at all and past 1e-4 nats, and is_greedy flips.

Measured before the score cache keyed an activation-rounding checkpoint's scores by CPU and thread count
(quantize/evaluate/cache.py Runtime.rounding): what made that key necessary. Loads here go through load_model, not
LastModel, so torch.set_num_threads is not overridden by the scorer's pin (quantize/machine.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from quantize.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "outputs" / "fp8-e4m3", ROOT / "outputs" / "references" / "rtn-w8a16-g128"]
TOL = 1e-4  # nats per request: the scorer's equality tolerance (tests/evaluate/test_lm.py TOL)


def measure(path: Path, threads: list[int], n_items: int) -> dict:
    import numpy as np
    import torch
    from test_lm import items, ours  # tests/evaluate on sys.path (main)

    from quantize.checkpoint import qdq
    from quantize.checkpoint.loader import load_model

    loaded = load_model(path, dtype=torch.float32)
    reqs = items(loaded, n_items, seed=3)
    runs = {}
    for t in threads:
        torch.set_num_threads(t)
        started = time.monotonic()
        with qdq.installed():
            out = ours(loaded, batch_size=16, max_length=256).loglikelihood(reqs, disable_tqdm=True)
        runs[t] = (np.array([ll for ll, _ in out]), [g for _, g in out], time.monotonic() - started)
    first, *rest = threads
    name = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    row: dict = {"checkpoint": name, "requests": len(reqs)}
    for t in rest:
        d = np.abs(runs[first][0] - runs[t][0])
        flips = sum(a != b for a, b in zip(runs[first][1], runs[t][1], strict=True))
        row[f"{first}_vs_{t}"] = {
            "max_abs_dll": float(d.max()),
            "requests_differing": int((d > 0).sum()),
            "requests_past_1e-4": int((d > TOL).sum()),
            "is_greedy_flips": int(flips),
        }
    row["seconds"] = {str(t): round(runs[t][2], 1) for t in threads}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--threads", nargs="+", type=int, default=[2, 1])
    ap.add_argument("--items", type=int, default=24, help="multiple-choice items (4 requests each)")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "thread_variance.json")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "evaluate")]
    if missing := [str(p) for p in args.checkpoints if not (p / "config.json").is_file()]:
        sys.exit(f"not a checkpoint folder: {', '.join(missing)} (the defaults are `make demo`'s outputs)")
    rows = [measure(p, args.threads, args.items) for p in args.checkpoints]
    for r in rows:
        pairs = {k: v for k, v in r.items() if "_vs_" in k}
        print(r["checkpoint"], r["requests"], "requests:", json.dumps(pairs))
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": cpu_name(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
