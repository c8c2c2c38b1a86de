"""A/A across scoring dtypes: one checkpoint scored in float32 and in bfloat16 on the same suite, item by item.

    python benchmarks/dtype_aa.py [CHECKPOINT] [--suite evaluate/core-v2.yaml] [--json OUT]

The suite as written (dtype auto: float32 on a CPU) and a copy of it with `dtype: bfloat16`, both scored through
the cache (the dtype is part of every score's key, so neither serves the other). Per accuracy task: n, items
right in float32 and not in bf16 and back (flips), the flip rate (b + c)/n, Δ = mean(bf16 − float32) and the
exact McNemar p; per document task the perplexity ratio bf16/float32; and each side's scoring wall time from its
record. What bf16 would change in a verdict is what these flips do against a policy's margins: a flip rate of a
few tenths of a percent moves no verdict at a 2-point margin, one of several percent can. CHECKPOINT defaults to
the embedded default model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def bf16_copy(suite_path: Path, out: Path) -> Path:
    """The suite with dtype bfloat16 and its golden path absolute (the copy lives elsewhere)."""
    import yaml

    from quantize.evaluate.suite import load_suite

    suite, _ = load_suite(suite_path)
    data = yaml.safe_load(suite_path.read_text())
    data.update(dtype="bfloat16", golden=str(Path(suite.golden).resolve()), name=f"{suite.name}-bf16")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def compare(a, b) -> dict:
    """Task by task, float32 (a) against bf16 (b): flips and McNemar for accuracy, the ratio for documents."""
    from scipy.stats import binomtest

    rows = {}
    for task, ta in a.tasks.items():
        tb = b.tasks[task]
        by_id = {i.id: i for i in tb.items}
        pairs = [(i, by_id[i.id]) for i in ta.items]
        if hasattr(ta.items[0], "words"):
            lla, llb = sum(x.ll for x, _ in pairs), sum(y.ll for _, y in pairs)
            words = sum(x.words for x, _ in pairs)
            rows[task] = {"n": len(pairs), "ppl_ratio": math.exp(-(llb - lla) / words)}
            continue
        right_wrong = sum(x.score > 0.5 >= y.score for x, y in pairs)
        wrong_right = sum(y.score > 0.5 >= x.score for x, y in pairs)
        n = len(pairs)
        flips = right_wrong + wrong_right
        p = binomtest(right_wrong, flips, 0.5).pvalue if flips else 1.0
        delta = sum(y.score - x.score for x, y in pairs) / n
        rows[task] = {
            "n": n,
            "right_to_wrong": right_wrong,
            "wrong_to_right": wrong_right,
            "flip_rate": flips / n,
            "delta": delta,
            "mcnemar_p": p,
        }
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--suite", default=str(ROOT / "evaluate" / "core-v2.yaml"))
    ap.add_argument("--json")
    args = ap.parse_args()
    from quantize.checkpoint.loader import resolve_model
    from quantize.evaluate.score import score
    from quantize.evaluate.suite import open_suite

    ckpt = Path(args.checkpoint) if args.checkpoint else resolve_model(None)
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = bf16_copy(Path(args.suite), Path(tmp) / "suite-bf16.yaml")
        a, _ = score(open_suite(args.suite), ckpt)
        b, _ = score(open_suite(bf16), ckpt)
    rows = compare(a, b)
    seconds = {"float32": a.wall_seconds, "bfloat16": b.wall_seconds}
    print(
        f"A/A across dtypes: {ckpt} on {args.suite}; scoring {seconds['float32']:.0f} s float32, "
        f"{seconds['bfloat16']:.0f} s bf16 ({seconds['float32'] / seconds['bfloat16']:.2f}x)"
    )
    for task, r in rows.items():
        if "ppl_ratio" in r:
            print(f"  {task:14s} n {r['n']:5d}  perplexity ratio bf16/float32 {r['ppl_ratio']:.4f}")
        else:
            print(
                f"  {task:14s} n {r['n']:5d}  flips {r['right_to_wrong']:3d} right->wrong, {r['wrong_to_right']:3d} "
                f"wrong->right ({100 * r['flip_rate']:.2f}%)  Δ {100 * r['delta']:+.2f} points  "
                f"McNemar p {r['mcnemar_p']:.3g}"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"checkpoint": str(ckpt), "suite": args.suite, "seconds": seconds, "tasks": rows}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
