"""Size the golden set: score the default model and a damaged copy, measure per-item flips, and
compute the items each accuracy task needs to detect a drop of m at one-sided α with power 1 − β:

    n ≈ (z₁₋α + z₁₋β)² · σ_D² / m²,   σ_D² = f − Δ²  (f = flip rate, Δ = mean paired difference)

    python benchmarks/golden_sizing.py BASELINE DAMAGED [--suite evaluate/core.yaml] [--margin 0.02]

Scores come from `quantize eval` (cached). Prints a Markdown table and writes it, with the raw
figures, to benchmarks/results/golden_sizing.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from quantize import stats  # noqa: E402
from quantize.evaluate.agreement import agreement_scores  # noqa: E402
from quantize.evaluate.score import score  # noqa: E402
from quantize.evaluate.suite import open_suite  # noqa: E402
from quantize.records import RollingTask  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline")
    ap.add_argument("damaged")
    ap.add_argument("--suite", default=str(ROOT / "evaluate" / "core.yaml"))
    ap.add_argument("--margin", type=float, default=0.02)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--power", type=float, default=0.8)
    args = ap.parse_args()
    suite = open_suite(args.suite)
    base, dmg = score(suite, args.baseline).doc, score(suite, args.damaged).doc
    rows, raw = [], {"baseline_wall_seconds": base.wall_seconds, "damaged_wall_seconds": dmg.wall_seconds, "tasks": {}}
    for task, b in base.tasks.items():
        d = dmg.tasks[task]
        bi = {i.id: i for i in b.items}
        pairs = [(bi[i.id], i) for i in d.items]
        if isinstance(b, RollingTask):
            w = sum(x.words for x, _ in pairs)
            nbytes = sum(x.bytes for x, _ in pairs)
            ratio, lo, hi = stats.bootstrap_ppl_ratio(
                [-x.ll for x, _ in pairs],
                [-y.ll for _, y in pairs],
                [x.words for x, _ in pairs],
                [x.cluster for x, _ in pairs],
                args.alpha,
            )
            raw["tasks"][task] = {
                "n": len(pairs),
                "bits_per_byte": b.bits_per_byte,
                "damaged_bits_per_byte": d.bits_per_byte,
                "word_ppl_ratio": ratio,
                "ratio_bounds": [lo, hi],
                "words": w,
                "bytes": nbytes,
            }
            rows.append(
                f"| {task} | {len(pairs)} | bits/byte {b.bits_per_byte:.3f} | - | {d.bits_per_byte:.3f} | "
                f"word-ppl ratio {ratio:.3f} [{lo:.3f}, {hi:.3f}] | - | - | - |"
            )
            continue
        diff = [y.score - x.score for x, y in pairs]
        n = len(diff)
        b_flips = sum(v < 0 for v in diff)
        c_flips = sum(v > 0 for v in diff)
        f = (b_flips + c_flips) / n
        delta = sum(diff) / n
        sd = math.sqrt(max(f - delta**2, 1e-12))
        need = stats.n_required(sd, args.margin, args.alpha, args.power)
        mde = stats.min_detectable(sd, n, args.alpha, args.power)
        raw["tasks"][task] = {
            "n": n,
            "acc": b.acc,
            "acc_se": b.acc_se,
            "chance": b.chance,
            "damaged_acc": d.acc,
            "flips_right_to_wrong": b_flips,
            "flips_wrong_to_right": c_flips,
            "flip_rate": f,
            "delta": delta,
            "n_needed": need,
            "min_detectable": mde,
            "mcnemar_p": stats.mcnemar_exact(b_flips, c_flips),
        }
        rows.append(
            f"| {task} | {n} | {b.acc:.3f} ± {b.acc_se:.3f} | {b.chance:.2f} | {d.acc:.3f} | "
            f"{b_flips} → wrong, {c_flips} → right (f = {f:.3f}) | {need:,} | {mde:.3f} | "
            f"{stats.mcnemar_exact(b_flips, c_flips):.2g} |"
        )
    agreement = agreement_scores(suite, Path(args.baseline), Path(args.damaged))
    raw["agreement"] = agreement.model_dump()
    header = (
        "| task | n | default model | chance | damaged | flips (rate f) | n for a "
        f"{args.margin:.0%} drop | smallest drop detectable at this n | McNemar p |"
    )
    table = "\n".join([header, "|" + "---|" * 9, *rows])
    a = agreement
    table += (
        f"\n\nAgreement of the damaged copy with the default model ({a.positions} positions, "
        f"{a.items} items): mean KL ≥ {a.kl_mean:.4f} ± {a.kl_se:.4f} "
        f"(p99 {a.kl_p99:.3f}), top-1 {a.top1:.3f}, Σ min(p, q) ≤ {a.sum_min:.3f}."
    )
    table += f"\n\nScoring wall time: default model {base.wall_seconds:.0f} s, damaged copy {dmg.wall_seconds:.0f} s."
    print(table)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "golden_sizing.md").write_text(table + "\n")
    (out / "golden_sizing.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
